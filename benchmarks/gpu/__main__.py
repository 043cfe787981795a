import sys

from benchmarks.gpu.tier import main

sys.exit(main())
