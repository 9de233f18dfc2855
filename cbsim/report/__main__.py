"""python -m cbsim.report TRACE [TRACE ...] [-o report.html]: see cbsim.report.trace_report."""

import sys

from cbsim.report.trace_report import main

sys.exit(main())
