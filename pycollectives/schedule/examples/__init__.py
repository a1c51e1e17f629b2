"""Shipped schedules, each a function of the rank count that returns a checked-ready Program.
`pycollectives.schedule.registry.EXAMPLES` names them for pycoll-sim and lookup()."""
