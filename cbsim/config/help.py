"""What ``python -m cbsim --help`` lists, one screen: each config group with the options Hydra
finds for it at run time (conf/ and the user's profiles, so a new hardware file shows without an
edit here) and the keys users set most, with the values this command line composes. The whole
composed config is ``--cfg job``; the template is hydra.help in conf/config.yaml."""

from __future__ import annotations

import textwrap
from importlib import resources
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

# the groups --help lists, in the order a user decides them (hydra/launcher: the help's footer)
HELP_GROUPS = ("mode", "model", "hardware", "engine", "workload", "experiment")
# per group (or config node), the keys most runs set; every other key: --cfg job
HELP_KEYS: dict[str, tuple[str, ...]] = {
    "mode": ("device", "bands"),
    "engine": ("io_slots", "cuda_graphs", "streams"),
    "workload": ("batch_size", "prompt_len", "gen_len", "num_requests", "arrival", "rate", "seed"),
    "output": ("trace", "report", "progress"),
    "slo": ("ttft_ms", "tpot_ms"),
}
WIDTH = 100
WHAT = {
    "mode": "where it runs",
    "model": "the model's shapes",
    "hardware": "the GPU and host profile",
    "engine": "sync, async, or both",
    "workload": "requests and their lengths",
    "experiment": "a preset of all of these",
    "output": "what a run writes (null: the run decides)",
    "slo": "serving targets",
}


def group_options(group: str, searchpath: list[str] = ()) -> list[str]:
    """The options Hydra would accept for ``group``: its own repository's (cbsim.conf; the
    files there outside a Hydra app) and those under the primary config's ``hydra.searchpath``
    (user profiles), without the schemas registered beside them."""
    try:
        from hydra.core.global_hydra import GlobalHydra

        names = set(GlobalHydra.instance().config_loader().get_group_options(group))
    except (ValueError, AttributeError):  # no Hydra app initialised (a test, a library call)
        root = resources.files("cbsim.conf").joinpath(group)
        names = {f.name[:-5] for f in root.iterdir() if f.name.endswith(".yaml")}
    for entry in searchpath:
        folder = Path(entry.removeprefix("file://")) / group
        if entry.startswith("file://") and folder.is_dir():
            names |= {f.stem for f in folder.glob("*.yaml")}
    return sorted(n for n in names if not n.endswith("_schema"))


def _value(v: Any) -> str:
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def _keys(node: Any, keys: tuple[str, ...], prefix: str) -> str:
    if not isinstance(node, DictConfig):
        return ""
    pairs = [f"{prefix}.{k}={_value(OmegaConf.select(node, k))}" for k in keys if k in node]
    return _wrap(" ".join(pairs), "    ") if pairs else ""


def _wrap(text: str, indent: str = "") -> str:
    return textwrap.fill(text, WIDTH, initial_indent=indent, subsequent_indent="    ")


def _choice(root: DictConfig | None, group: str) -> str | None:
    if root is None or group == "experiment":
        return None
    try:
        return OmegaConf.select(root, f"hydra.runtime.choices.{group}")
    except Exception:  # outside Hydra's help there are no choices to show
        return None


def help_groups(*, _root_: DictConfig | None = None) -> str:
    """Each group, its options and the current choice, then its common keys as key=value."""
    lines = []
    searchpath = list(OmegaConf.select(_root_, "hydra.searchpath") or []) if _root_ else []
    for group in HELP_GROUPS:
        prefix = "+" if group == "experiment" else ""
        chosen = _choice(_root_, group)
        now = f", now {chosen}" if chosen else ""
        lines.append(
            _wrap(
                f"{prefix}{group}: {', '.join(group_options(group, searchpath))}  # {WHAT[group]}{now}"
            )
        )
        node = _root_.get(group) if _root_ is not None else None
        keys = _keys(node, HELP_KEYS.get(group, ()), group)
        if keys:
            lines.append(keys)
    for node in ("output", "slo"):
        lines.append(f"{node}:  # {WHAT[node]}")
        keys = _keys(_root_.get(node) if _root_ is not None else None, HELP_KEYS[node], node)
        if keys:
            lines.append(keys)
    return "\n".join(lines)
