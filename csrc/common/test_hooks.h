// Test hooks: process-wide knobs that only tests set, through private bindings of pycollectives._C
// (never from the environment), to widen race windows that are otherwise microseconds long.
#pragma once

#include <chrono>
#include <cstdint>

namespace pycoll::test_hooks {

// How long a backend thread (serial executor, point-to-point lane) keeps a finished task before it
// lets go of it: lets a test drop every other reference meanwhile, so that the backend thread
// drops the last one (teardown on the backend's own thread). 0 in production.
std::chrono::milliseconds thread_linger();
void set_thread_linger(std::chrono::milliseconds ms);

// Sleeps for thread_linger() when it is set.
void linger_if_set();

// Makes this process's cross-memory attach reads fail with EPERM, as where the OS forbids them
// (cpu/peer_read.h). false in production.
bool deny_peer_read();
void set_deny_peer_read(bool deny);

// Makes this process fail to open its peers' shared-memory files with EACCES, as where the OS
// forbids it (cpu/shared_storage.h). false in production.
bool deny_shared_open();
void set_deny_shared_open(bool deny);

// How many times this process's CPU engines voted on mapping peers' shared files (a vote is
// skipped when every rank is known to hold them mapped): tests read it.
void count_shared_vote();
int64_t shared_votes();

// How many point-to-point messages this process received by reference, copied straight out of the
// sender's shared file (cpu/p2p.h): tests read it.
void count_p2p_by_reference();
int64_t p2p_by_reference();

// How many point-to-point messages this process wrote straight into their receiver's shared
// buffer (cpu/p2p.h): tests read it.
void count_p2p_into_receiver();
int64_t p2p_into_receiver();

// How many bytes this process wrote with streaming stores (cpu/kernels/stream_store.h): tests read it.
void count_streamed_bytes(int64_t bytes);
int64_t streamed_bytes();

}  // namespace pycoll::test_hooks
