"""``python -m diffsim_ros.cli`` (and ``torchrun -m diffsim_ros.cli``): the diffsim-ros command."""
import sys

from diffsim_ros.cli import main

sys.exit(main())
