"""The Python backend on real model.py files, in process and isolated in worker processes.

One model.py (TOOLBOX) misbehaves on command: the first value of its input picks a crash, a hang, a leak, a
bad output or an exception, so each test loads it once and drives it. Isolated tests start real workers.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from modelhost.backends.base import InstanceSettings, Model, config_signature
from modelhost.backends.python.backend import PythonBackend
from modelhost.backends.python.isolated import IsolatedModel
from modelhost.config.completion import apply_defaults
from modelhost.config.pbtxt import ConfigError, parse_config
from modelhost.errors import ErrorKind, ModelhostError
from tests.server import wait_for

CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "pid" data_type: TYPE_INT64 dims: [ 1 ] } ]
"""
ISOLATED = 'parameters { key: "isolation" value: { string_value: "process" } }\n'

TOOLBOX = '''
import ctypes, json, os, time
from pathlib import Path
import numpy as np
from modelhost.errors import invalid
from helper import TWO  # beside model.py in the version directory

LOADED = []  # module state: each instance has a module object of its own


class Model:
    def initialize(self, args):
        directory = Path(args["model_directory"])
        if (directory / "fail_initialize").exists():
            raise RuntimeError("told to fail")
        LOADED.append(self)
        record = {key: args[key] for key in ("model_name", "model_version", "model_instance_index", "model_directory")}
        record["config_max_batch_size"] = args["model_config"]["max_batch_size"]
        record["loaded_in_module"] = len(LOADED)
        (directory / f"init_{args['model_instance_index']}_{os.getpid()}.json").write_text(json.dumps(record))
        self.directory = directory
        self.leak = None

    def execute(self, inputs):
        x = inputs["x"]
        code = int(x[0, 0])
        rows = x.shape[0]
        pid = np.full((rows, 1), os.getpid(), np.int64)
        if code == 666:
            os._exit(3)
        if code == 777:
            ctypes.string_at(0)  # segfault
        if code == 888:
            time.sleep(60)
        if code == 999:
            self.leak = np.ones(64 * 2**20, np.uint8)  # touched: resident
        if code == 1:
            return {"pid": pid}
        if code == 2:
            return {"y": x.astype(np.float64), "pid": pid}
        if code == 3:
            return {"y": x[1:] * TWO, "pid": pid[1:]}
        if code == 4:
            return {"y": x.tolist(), "pid": pid}
        if code == 5:
            return [x]
        if code == 6:
            raise ValueError("bad value")
        if code == 7:
            raise invalid("x must not be 7")
        if code == 8:
            import late  # a sibling imported only now, as Triton's model.py may
            return {"y": x * late.THREE, "pid": pid}
        return {"y": x * TWO, "pid": pid}

    def finalize(self):
        (self.directory / f"finalized_{os.getpid()}").write_text("")
'''


def write_model(root: Path, name: str, code: str = TOOLBOX, config: str = CONFIG) -> Path:
    """A model directory <root>/<name> with config.pbtxt and 1/model.py (+ 1/helper.py, 1/late.py); returns model.py."""
    version = root / name / "1"
    version.mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(config)
    (version / "helper.py").write_text("TWO = 2\n")
    (version / "late.py").write_text("THREE = 3\n")
    (version / "model.py").write_text(code)
    return version / "model.py"


def load(path: Path, index: int = 0) -> Model:
    model_dir = path.parent.parent
    config = parse_config((model_dir / "config.pbtxt").read_text())
    apply_defaults(config, model_dir.name, "", "python")
    return PythonBackend().load(path, config, InstanceSettings(index, 1))


def batch(code: float, rows: int = 2) -> dict[str, np.ndarray]:
    x = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
    x[0, 0] = code
    return {"x": x}


def run(model: Model, code: float, rows: int = 2) -> dict[str, np.ndarray]:
    return model.infer(batch(code, rows), ["y", "pid"])


def exited(pid: int) -> bool:
    """Whether a process has exited (a zombie not yet reaped counts). Every thread must be a zombie: the main
    thread of a killed process shows "Z" while its other threads are still exiting, its files still open."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
        return all((task / "stat").read_text().split(")")[-1].split()[0] == "Z" for task in tasks)
    except FileNotFoundError:
        return True


def reapable(child: int) -> bool:
    """Whether a child of this process can be waited for now: what its Popen.poll() will see next. WNOWAIT leaves
    it unreaped. (All of its threads can show as zombies a moment before the kernel lets it be waited for.)"""
    return os.waitid(os.P_PID, child, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def init_records(model_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(model_dir.glob("init_*.json"), key=os.path.getmtime)]


@pytest.fixture(params=["in_process", "isolated"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def toolbox(tmp_path: Path, mode: str) -> Iterator[Model]:
    model = load(write_model(tmp_path, "toolbox", config=CONFIG + (ISOLATED if mode == "isolated" else "")))
    yield model
    model.unload()


# --------------------------------------------------------------------------- both modes


def test_runs_batches_with_initialize_args(toolbox: Model, tmp_path: Path, mode: str) -> None:
    outputs = run(toolbox, 10.0, rows=3)
    np.testing.assert_array_equal(outputs["y"], batch(10.0, rows=3)["x"] * 2)
    worker = int(outputs["pid"][0, 0])
    assert (worker == os.getpid()) == (mode == "in_process")
    [record] = init_records(tmp_path / "toolbox")
    assert record == {"model_name": "toolbox", "model_version": "1", "model_instance_index": 0,
                      "model_directory": str(tmp_path / "toolbox"), "config_max_batch_size": 8,
                      "loaded_in_module": 1}
    # As Triton's stub leaves it: the version directory stays on sys.path of the process that imported model.py.
    assert (str((tmp_path / "toolbox" / "1").resolve()) in sys.path) == (mode == "in_process")


def test_model_py_imports_a_sibling_inside_execute(toolbox: Model) -> None:
    outputs = run(toolbox, 8.0)
    np.testing.assert_array_equal(outputs["y"], batch(8.0)["x"] * 3)


def test_signature_is_the_configs(toolbox: Model) -> None:
    signature = toolbox.signature()
    assert signature is not None
    assert [(s.name, s.datatype, s.shape) for s in signature.inputs] == [("x", "FP32", (-1, -1))]
    assert [(s.name, s.datatype, s.shape) for s in signature.outputs] == [
        ("y", "FP32", (-1, -1)), ("pid", "INT64", (-1, 1))]


@pytest.mark.parametrize("code, problem", [
    (1, "execute returned no output 'y' (it returned 'pid')"),
    (2, "output 'y' has dtype float64, but config.pbtxt declares FP32 (float32); modelhost does not cast"),
    (3, "output 'y' has shape [1,3]: batch size 1, but the batch has 2 rows"),
    (4, "output 'y' is a list, not a numpy array"),
    (5, "execute returned a list, not a dict of numpy arrays"),
])
def test_bad_outputs_name_the_model_and_output(
    toolbox: Model, caplog: pytest.LogCaptureFixture, code: int, problem: str
) -> None:
    with caplog.at_level(logging.ERROR, "modelhost.backends.python.backend"), pytest.raises(ModelhostError) as raised:
        run(toolbox, code)
    assert raised.value.kind is ErrorKind.INTERNAL
    assert raised.value.message == f"Python model 'toolbox' version 1 instance 0: {problem}"
    assert raised.value.message in caplog.text  # the model's bug: logged for the operator
    assert run(toolbox, 10.0)["y"].shape == (2, 3)  # the instance still serves


def test_execute_exceptions(toolbox: Model, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, "modelhost.backends.python.backend"), pytest.raises(ModelhostError) as raised:
        run(toolbox, 6)
    assert raised.value.kind is ErrorKind.INTERNAL
    assert raised.value.message.startswith(
        "Python model 'toolbox' version 1 instance 0: execute raised ValueError: bad value (model.py line ")
    assert "Traceback" in caplog.text and 'raise ValueError("bad value")' in caplog.text
    with pytest.raises(ModelhostError) as raised:
        run(toolbox, 7)  # the model's own ModelhostError keeps its kind
    assert (raised.value.kind, raised.value.message) == (ErrorKind.INVALID_INPUT, "x must not be 7")


def test_only_requested_outputs_come_back(toolbox: Model) -> None:
    assert list(toolbox.infer(batch(10.0), ["pid"])) == ["pid"]


def test_finalize_runs_at_unload(tmp_path: Path, mode: str) -> None:
    model = load(write_model(tmp_path, "m", config=CONFIG + (ISOLATED if mode == "isolated" else "")))
    worker = int(run(model, 10.0)["pid"][0, 0])
    model.unload()
    assert (tmp_path / "m" / f"finalized_{worker}").exists()
    if mode == "isolated":
        with pytest.raises(ProcessLookupError):
            os.kill(worker, 0)  # exited and reaped


@pytest.mark.parametrize("code, reason", [
    ("import no_such_module\n", "1/model.py failed to import: ModuleNotFoundError: No module named "
                                "'no_such_module' (model.py line 1)"),
    ("x = = 1\n", "1/model.py failed to import: SyntaxError: invalid syntax (model.py line 1)"),
    ("class Other:\n    pass\n", "1/model.py defines no class Model (nor Triton's class TritonPythonModel)"),
    ("class Model:\n    pass\n", "1/model.py: class Model has no execute(self, inputs) method"),
    ("class Model:\n    def initialize(self, args):\n        raise KeyError('weights')\n"
     "    def execute(self, inputs):\n        return {}\n",
     "1/model.py: initialize raised KeyError: 'weights' (model.py line 3)"),
])
def test_unusable_model_py_fails_the_load(tmp_path: Path, mode: str, code: str, reason: str) -> None:
    path = write_model(tmp_path, "broken", code, CONFIG + (ISOLATED if mode == "isolated" else ""))
    with pytest.raises(ConfigError) as raised:
        load(path)
    assert str(raised.value) == f"{tmp_path}/broken/{reason}"
    assert not [name for name in sys.modules if name.startswith("modelhost_python_model_broken")]


def test_instances_have_modules_of_their_own(tmp_path: Path) -> None:
    path = write_model(tmp_path, "twice")
    first, second = load(path, 0), load(path, 1)
    try:
        records = init_records(tmp_path / "twice")
        assert [(r["model_instance_index"], r["loaded_in_module"]) for r in records] == [(0, 1), (1, 1)]
    finally:
        first.unload()
        second.unload()
    assert not [name for name in sys.modules if name.startswith("modelhost_python_model_twice")]


# --------------------------------------------------------------------------- config


def test_config_must_list_the_tensors(tmp_path: Path) -> None:
    path = write_model(tmp_path, "bare", config='backend: "python"\nmax_batch_size: 8\n')
    message = "a Python model declares no tensors; config.pbtxt must list all its inputs and outputs"
    with pytest.raises(ConfigError, match=message):
        load(path)
    with pytest.raises(ConfigError, match=message):
        PythonBackend().describe(path)


def test_signature_shapes_follow_batching_and_reshape() -> None:
    config = parse_config("""
        max_batch_size: 0
        input [ { name: "x" data_type: TYPE_STRING dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]
        output [ { name: "y" data_type: TYPE_UINT8 dims: [ -1 ] } ]
    """)
    signature = config_signature(config, "config.pbtxt")
    assert [(s.name, s.datatype, s.shape) for s in (*signature.inputs, *signature.outputs)] == [
        ("x", "BYTES", (2, 2)), ("y", "UINT8", (-1,))]
    config.max_batch_size = 4
    assert config_signature(config, "config.pbtxt").inputs[0].shape == (-1, 2, 2)


@pytest.mark.parametrize("parameter, value, problem", [
    ("isolation", "thread", "parameter isolation must be one of none, process, got 'thread'"),
    ("execute_timeout_seconds", "soon", "parameter execute_timeout_seconds must be a number, got 'soon'"),
    ("worker_max_rss_bytes", "-1", r"parameter worker_max_rss_bytes must be >= 0 \(0 = no limit\), got '-1'"),
])
def test_bad_parameters(tmp_path: Path, parameter: str, value: str, problem: str) -> None:
    extra = f'parameters {{ key: "{parameter}" value: {{ string_value: "{value}" }} }}\n'
    with pytest.raises(ConfigError, match=problem):
        load(write_model(tmp_path, "params", config=CONFIG + extra))


# --------------------------------------------------------------------------- isolated


def isolated(tmp_path: Path, name: str, **parameters: str) -> IsolatedModel:
    extra = "".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in parameters.items())
    model = load(write_model(tmp_path, name, config=CONFIG + ISOLATED + extra))
    assert isinstance(model, IsolatedModel)
    return model


@pytest.fixture
def fragile(tmp_path: Path) -> Iterator[IsolatedModel]:
    model = isolated(tmp_path, "fragile", execute_timeout_seconds="1", worker_max_rss_bytes=str(80 * 2**20))
    yield model
    model.unload()


@pytest.mark.parametrize("code, what", [(666, "exited with code 3"), (777, "was killed by signal 11 (SIGSEGV)")])
def test_crash_fails_the_batch_and_restarts_the_worker(
    fragile: IsolatedModel, tmp_path: Path, caplog: pytest.LogCaptureFixture, code: int, what: str
) -> None:
    before = fragile.worker_pid()
    with caplog.at_level(logging.ERROR, "modelhost.backends.python.backend"), pytest.raises(ModelhostError) as raised:
        run(fragile, code)
    assert raised.value.kind is ErrorKind.INTERNAL
    expected = (f"Python model 'fragile' version 1 instance 0: its worker process (pid {before}) {what} "
                "while running this batch; the worker is restarting")
    assert raised.value.message == expected
    assert expected in caplog.text
    after = int(run(fragile, 10.0)["pid"][0, 0])
    assert after not in (before, os.getpid())
    assert len(init_records(tmp_path / "fragile")) == 2  # initialize ran again in the new worker


def test_hang_times_out_and_restarts_the_worker(fragile: IsolatedModel) -> None:
    before = fragile.worker_pid()
    started = time.monotonic()
    with pytest.raises(ModelhostError) as raised:
        run(fragile, 888)
    assert 1 <= time.monotonic() - started < 5
    assert raised.value.kind is ErrorKind.TIMEOUT
    assert raised.value.message == (
        f"Python model 'fragile' version 1 instance 0: its worker process (pid {before}) did not answer within "
        "1 s (execute_timeout_seconds), so it was killed; the worker is restarting")
    assert int(run(fragile, 10.0)["pid"][0, 0]) != before
    with pytest.raises(ProcessLookupError):
        os.kill(before, 0)


def test_memory_limit_restarts_the_worker_after_answering(
    fragile: IsolatedModel, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    before = fragile.worker_pid()
    assert int(run(fragile, 10.0)["pid"][0, 0]) == before  # under the limit: kept
    with caplog.at_level(logging.WARNING, "modelhost.backends.python.backend"):
        leaked = run(fragile, 999)  # over the limit: answered, then restarted
    assert int(leaked["pid"][0, 0]) == before
    assert "above worker_max_rss_bytes 83886080; restarting it after this batch" in caplog.text
    assert int(run(fragile, 10.0)["pid"][0, 0]) != before
    assert (tmp_path / "fragile" / f"finalized_{before}").exists()  # stopped gracefully


def test_worker_that_cannot_restart_fails_batches_until_it_can(fragile: IsolatedModel, tmp_path: Path) -> None:
    (tmp_path / "fragile" / "fail_initialize").write_text("")
    with pytest.raises(ModelhostError):
        run(fragile, 666)
    with pytest.raises(ModelhostError) as raised:
        run(fragile, 10.0)
    assert raised.value.kind is ErrorKind.UNAVAILABLE
    assert raised.value.message == (
        "Python model 'fragile' version 1 instance 0: its worker process cannot start: "
        f"{tmp_path}/fragile/1/model.py: initialize raised RuntimeError: told to fail (model.py line 15)")
    (tmp_path / "fragile" / "fail_initialize").unlink()
    assert run(fragile, 10.0)["y"].shape == (2, 3)


def test_worker_that_died_between_batches_is_replaced_before_the_next(
    fragile: IsolatedModel, caplog: pytest.LogCaptureFixture
) -> None:
    before = fragile.worker_pid()
    assert before is not None
    os.kill(before, signal.SIGKILL)
    wait_for(lambda: reapable(before), timeout=10, what=f"worker {before} to die")  # the backend's own child
    with caplog.at_level(logging.ERROR, "modelhost.backends.python.backend"):
        after = int(run(fragile, 10.0)["pid"][0, 0])  # no batch is lost
    assert after != before
    assert f"(pid {before}) was killed by signal 9 (SIGKILL) between batches; restarting it" in caplog.text


def test_worker_that_dies_or_hangs_while_loading_fails_the_load(tmp_path: Path) -> None:
    dies = write_model(tmp_path, "dies", "import os\nos._exit(5)\n", CONFIG + ISOLATED)
    with pytest.raises(ConfigError, match="1/model.py: the worker process exited with code 5 while loading it"):
        load(dies)
    slow = ("import time\nclass Model:\n    def initialize(self, args):\n        time.sleep(60)\n"
            "    def execute(self, inputs):\n        return {}\n")
    timeout = 'parameters { key: "initialize_timeout_seconds" value: { string_value: "0.3" } }\n'
    hangs = write_model(tmp_path, "hangs", slow, CONFIG + ISOLATED + timeout)
    with pytest.raises(ConfigError, match=r"initialize did not finish within 0.3 s \(initialize_timeout_seconds\)"):
        load(hangs)


SERVER_THAT_DIES = """
import sys, threading
from pathlib import Path
import numpy as np
from tests.backends.test_python_backend import load, run
model = load(Path(sys.argv[1]))
print(model.worker_pid(), flush=True)
threading.Thread(target=run, args=(model, 888), daemon=True).start()  # hangs in the worker
sys.stdin.read()
"""


def test_worker_does_not_outlive_a_killed_server(tmp_path: Path) -> None:
    path = write_model(tmp_path, "orphan", config=CONFIG + ISOLATED)
    server = subprocess.Popen([sys.executable, "-c", SERVER_THAT_DIES, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2])
    assert server.stdout is not None
    worker = int(server.stdout.readline())
    time.sleep(0.2)  # the hanging batch reaches the worker
    server.kill()
    server.wait()
    wait_for(lambda: exited(worker), timeout=10, what=f"worker {worker} to exit after its server was killed")
