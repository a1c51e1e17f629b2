"""The one error of the schedule language: a program that is not a correct schedule."""


class ScheduleError(ValueError):
    """A schedule that is malformed or computes the wrong result.

    The message names the rank, the step (its index in its lane) and the chunk, and what that
    chunk holds against what the collective needs there.
    """
