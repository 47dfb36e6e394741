import sys

from llmtrace.cli import main

sys.exit(main())
