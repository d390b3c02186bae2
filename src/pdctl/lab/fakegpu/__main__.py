import sys

from pdctl.lab.fakegpu.nvidia_smi import main

sys.exit(main())
