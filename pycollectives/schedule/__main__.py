"""python -m pycollectives.schedule: the same as pycoll-sim."""
import sys

from .simulate import main

sys.exit(main())
