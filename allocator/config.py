"""The daemon's config: one YAML file validated with jsonschema; every bad
key or value is reported with its path."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from gpuslice import constants, errors
from gpuslice.cdi.registry import SPEC_DIRS
from gpuslice.units import parse_bytes

if TYPE_CHECKING:
    import jsonschema

# while a GPU's costs are fitted, each slice gets CostSplit.learning's part of its own target
# ("share"), or of the fitting slices' mean target ("even": every boosted row then mixes the
# same loads, so a cost of sharing that grows as loads even out lands on no one slice; a
# candidate the next real-GPU run decides, docs/compute.md). Named here, where the config
# takes one, not in compute.py: `gpuslice status` reads the config without the controller
FIT_BASES = ("share", "even")

SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "socket": {"type": "string", "minLength": 1},
        "slice_socket": {"type": "string", "minLength": 1},
        "state_dir": {"type": "string", "minLength": 1},
        "slice_files_dir": {"type": "string", "minLength": 1},
        "ledger_dir": {"type": "string", "minLength": 1},  # the old name of slice_files_dir
        "metrics": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "address": {"type": "string"},
                "port": {"type": "integer", "minimum": 0, "maximum": 65535},
            },
        },
        "sweep_interval": {"type": "number", "exclusiveMinimum": 0},
        "compute_period": {"type": "number", "minimum": 0.01, "maximum": 5},
        "compute_fit_base": {"enum": list(FIT_BASES)},
        "driver_memory_period": {"type": "number", "minimum": 0.05, "maximum": 60},
        "reservation_timeout": {"type": "number", "exclusiveMinimum": 0},
        # past the hook's and shim's own wait for the answer a deadline would outlive its client
        "runtime_request_timeout": {"type": "number", "exclusiveMinimum": 0, "maximum": constants.RUNTIME_TIMEOUT_S},
        "memory_oversubscription": {"type": "number", "minimum": 1, "maximum": 16},
        "context_reserve": {"type": ["string", "integer"]},
        "unsliced_processes": {"enum": ["charge", "kill"]},
        "nvml": {"enum": ["driver", "sim"]},
        "host_root": {"type": "string", "pattern": "^/"},
        "cdi_dirs": {"type": "array", "items": {"type": "string", "pattern": "^/"}, "minItems": 1},
        "sim": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"config": {"type": "string"}, "state_dir": {"type": "string"}},
        },
    },
}


class ConfigError(errors.InvalidArgument):
    """str() is one line per problem."""


@dataclass(frozen=True)
class Config:
    socket: Path = Path(constants.CONTROL_SOCKET)
    slice_socket: Path = Path(constants.SLICE_SOCKET)
    state_dir: Path = Path(constants.STATE_DIR)
    slice_files_dir: Path = Path(constants.SLICE_FILES_DIR)  # each slice's limits and usage files
    metrics_address: str = "127.0.0.1"
    # 0 turns the endpoint off; not 9400, where NVIDIA's dcgm-exporter listens on the same nodes
    metrics_port: int = 9445
    sweep_interval: float = 5.0
    compute_period: float = 0.05  # seconds between launch-budget refills (docs/compute.md)
    compute_fit_base: str = FIT_BASES[0]  # what a slice's budget while its costs are fitted is part of
    driver_memory_period: float = 1.0  # seconds between reads of the driver's per-process memory
    reservation_timeout: float = 300.0
    # a runtime socket request's whole arrival and answer: a client dripping a byte now and then is cut off
    runtime_request_timeout: float = float(constants.RUNTIME_TIMEOUT_S)
    memory_oversubscription: float = 1.0
    context_reserve: int = 0  # bytes the interposer charges per CUDA context
    # a process of a slice's container holding GPU memory without the interposer: charged to the
    # slice, or killed as well (docs/enforcement.md)
    unsliced_processes: str = "charge"
    nvml: str = "driver"
    sim_config: str | None = None
    sim_state_dir: str | None = None
    # where the host's / is as the daemon sees it: / on the host, /host in the node
    # agent's container; a bundle the hook or shim names is read under it
    host_root: Path = Path("/")
    # the CDI spec directories (as the daemon sees them), lowest priority first: the
    # shim's containers get their GPUs' edits from them
    cdi_dirs: tuple[Path, ...] = SPEC_DIRS
    extra: dict = field(default_factory=dict)

    @property
    def store_path(self) -> Path:
        return self.state_dir / "state.db"


def _where(err: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in err.absolute_path) or "(top level)"


def load(path: str | Path | None) -> Config:
    if path is None:
        return Config()
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as e:
        raise ConfigError(f"config {path}: cannot read: {e.strerror}") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"config {path}: not valid YAML: {e}".replace("\n", " ")) from e
    import jsonschema  # here: `gpuslice status` without --config starts a fifth sooner without it

    errors = sorted(jsonschema.Draft202012Validator(SCHEMA).iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        raise ConfigError("\n".join(f"config {path}: {_where(e)}: {e.message}" for e in errors))
    reserve = data.get("context_reserve", 0)
    try:
        reserve = parse_bytes(str(reserve))
    except ValueError as e:
        raise ConfigError(f"config {path}: context_reserve: {e}") from e
    metrics = data.get("metrics", {})
    sim = data.get("sim", {})
    d = Config()
    return Config(
        socket=Path(data.get("socket", d.socket)),
        slice_socket=Path(data.get("slice_socket", d.slice_socket)),
        state_dir=Path(data.get("state_dir", d.state_dir)),
        slice_files_dir=Path(data.get("slice_files_dir", data.get("ledger_dir", d.slice_files_dir))),
        metrics_address=metrics.get("address", d.metrics_address),
        metrics_port=metrics.get("port", d.metrics_port),
        sweep_interval=float(data.get("sweep_interval", d.sweep_interval)),
        compute_period=float(data.get("compute_period", d.compute_period)),
        compute_fit_base=data.get("compute_fit_base", d.compute_fit_base),
        driver_memory_period=float(data.get("driver_memory_period", d.driver_memory_period)),
        reservation_timeout=float(data.get("reservation_timeout", d.reservation_timeout)),
        runtime_request_timeout=float(data.get("runtime_request_timeout", d.runtime_request_timeout)),
        memory_oversubscription=float(data.get("memory_oversubscription", d.memory_oversubscription)),
        context_reserve=reserve,
        unsliced_processes=data.get("unsliced_processes", d.unsliced_processes),
        nvml=data.get("nvml", d.nvml),
        sim_config=sim.get("config"),
        sim_state_dir=sim.get("state_dir"),
        host_root=Path(data.get("host_root", d.host_root)),
        cdi_dirs=tuple(Path(x) for x in data["cdi_dirs"]) if "cdi_dirs" in data else d.cdi_dirs,
    )
