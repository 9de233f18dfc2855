"""What a run writes (the ``output`` group): the trace, the report, the table, a progress bar."""

from __future__ import annotations

from dataclasses import dataclass, field

from cbsim.config.ranges import Range, declare

MAX_CHART_POINTS = 20_000


@dataclass
class OutputConfig:
    """What a run writes into its Hydra run directory besides metrics.json and job_config.json.

    None: decided by the kind of run. A single run writes its trace, its report and prints its
    table; a sweep's job writes none of them (metrics.json holds every number the sweep's summary
    needs, and 200 jobs of 8 MB each would be 1.6 GB). true/false: always or never.

    A simulation with ``trace`` false holds no span, whatever its length: its metrics are folded
    as it runs, and its report (``report`` true) draws its timeline from windows of
    ``report_window_steps`` steps and every other chart from the fold.
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
    # a simulation without a trace (trace false, report on) keeps only the spans of three
    # windows of this many steps for the report's timeline (the first steps, a steady-state
    # window, the end: cbsim.trace.window), so its memory does not grow with the steps; its
    # other charts and the metrics cover every step
    report_window_steps: int = field(default=6, metadata=declare(Range(1, 100)))
    # the most points a per-step line of the report draws: a longer run's step-time lines keep
    # the min and max of each bucket of consecutive steps (spikes and stalls stay visible), so
    # a run of 10^6 steps still writes a small page that draws fast; shorter runs draw every step
    max_chart_points: int = field(default=MAX_CHART_POINTS, metadata=declare(Range(100)))

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
            report_window_steps=self.report_window_steps,
            max_chart_points=self.max_chart_points,
        )
