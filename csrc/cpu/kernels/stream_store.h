// Copies that write the user's output with streaming (non-temporal) stores.
//
// A plain store to a line that is not in the cache first reads the line from memory (read for
// ownership), so writing an output larger than the cache costs a read and a write of every byte.
// A streaming store writes the line without reading it, and does not keep it in the cache: a
// third less memory traffic per copy, and the pipelined slots are not evicted by output lines. In
// the cache plain stores win, so only outputs that outgrow the cache stream, and only where the op
// has not just read them (not an in-place all_reduce or broadcast, not reduce_scatter).
// docs/decisions/0021-streaming-stores-for-large-cpu-outputs.md
#pragma once

#include <cstddef>
#include <cstdint>

namespace pycoll {

// The least output tensor, in bytes (a receive: the message), that an op over `ranks` ranks of
// this host writes with streaming stores (PYCOLL_CPU_STREAM_STORE_MIN_BYTES; by default half the
// last-level cache of the first CPU the process may run on, divided among the ranks, between 4 and
// 32 MiB: below that the output is likely to stay in the cache, where plain stores win). Reads the
// setting: call it once per engine.
size_t stream_store_min_bytes(int ranks);

// memcpy(dst, src, bytes) with streaming stores for the aligned middle of dst; dst and src must not
// overlap. Ends with a store fence, so the bytes are visible to whoever is told after it returns.
void stream_copy(void* dst, const void* src, size_t bytes);

// stream_copy where `stream`, else memcpy.
void copy_to_output(bool stream, void* dst, const void* src, size_t bytes);

}  // namespace pycoll
