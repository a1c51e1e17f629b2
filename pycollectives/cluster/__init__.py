"""pycoll-cluster: simulated hosts on one machine, joined by real network links of a chosen rate.

Each simulated host is a network namespace (its own veth into a bridge, shaped with tc), with its
own mount namespace (a private /dev/shm) and hostname, and runs its ranks with the environment
torchrun gives them. One concept per module:

    rates.py       link rates ("1gbit") parsed and written back
    privileges.py  root, unprivileged user namespaces, or a clear error
    links.py       namespaces, bridge, veth pairs and their qdiscs; netem's probe; leftovers
    linkrate.py    the link's measured rate (a TCP transfer between two hosts; a standalone script)
    agent.py       one host's process: private /dev/shm, hostname, its ranks (a standalone script)
    runner.py      a whole run: build, measure, launch, supervise, clean up
    cli.py         the pycoll-cluster command

The scripts that run inside the namespaces import nothing of this package (no torch at start).
"""
