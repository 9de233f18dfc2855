"""What a run writes (the ``output`` group): the trace, the report, the table, a progress bar."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class OutputConfig:
    """What a run writes into its Hydra run directory besides metrics.json and job_config.json.

    None: decided by the kind of run. A single run writes its trace, its report and prints its
    table; a sweep's job writes none of them (metrics.json holds every number the sweep's summary
    needs, and 200 jobs of 8 MB each would be 1.6 GB). true/false: always or never.
    """

    trace: bool | None = None
    # trace.json.gz, not trace.json (the seed workload's full trace is tens of MB as text and
    # about a tenth of that gzipped); Perfetto opens either
    trace_gzip: bool = True
    report: bool | None = None
    # print the metrics table at the end of the run
    print_table: bool | None = None
    # a progress bar on stderr for simulations that take over a second (a single run only)
    progress: bool | None = None

    def decided(self, in_sweep: bool) -> OutputConfig:
        """Every None replaced by what this kind of run does."""

        def pick(value: bool | None, single: bool, sweep: bool) -> bool:
            return (sweep if in_sweep else single) if value is None else value

        return OutputConfig(
            trace=pick(self.trace, True, False),
            trace_gzip=self.trace_gzip,
            report=pick(self.report, True, False),
            print_table=pick(self.print_table, True, False),
            progress=pick(self.progress, True, False),
        )
