"""The two console entries, `modelhost serve` and `serve` (a SageMaker image's): flags + environment -> settings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from modelhost.cli import modelhost_settings, serve_settings
from modelhost.config.overrides import ModelOverrides
from modelhost.settings import GIB, ServerSettings, model_load_roots


def serve_error(capsys: pytest.CaptureFixture[str], argv: list[str], environ: dict[str, str],
                entry=modelhost_settings) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as info:
        entry(argv, environ)
    assert info.value.code == 2
    return capsys.readouterr().err


class TestModelhostServe:
    def test_defaults_are_unchanged(self) -> None:
        assert modelhost_settings(["serve"], {}) == ServerSettings()
        settings = modelhost_settings(["serve"], {})
        assert (settings.host, settings.model_repository, settings.http_port) == ("127.0.0.1", None, 8000)

    def test_flags_set_their_fields(self) -> None:
        settings = modelhost_settings([
            "serve", "--model-repository", "s3://bucket/prefix", "--sagemaker-port", "0", "--multi-model",
            "--model-cache-bytes", "512MiB", "--max-unpacked-bytes", "2GB", "--unpacked-cache-bytes", "1GiB",
            "--s3-endpoint-url",
            "http://127.0.0.1:9000", "--invocation-timeout-seconds", "5", "--strict-readiness", "--workers", "1",
            "--log-level", "debug",
        ], {})
        assert settings.model_repository == "s3://bucket/prefix"
        assert (settings.sagemaker_port, settings.multi_model, settings.strict_readiness) == (0, True, True)
        assert (settings.model_cache_bytes, settings.max_unpacked_bytes) == (512 * 1024**2, 2 * 1000**3)
        assert settings.unpacked_cache_bytes == 1024**3
        assert settings.s3_endpoint_url == "http://127.0.0.1:9000"
        assert (settings.invocation_timeout_seconds, settings.log_level) == (5.0, "debug")

    @pytest.mark.parametrize(("flags", "allowed"), [
        ([], False), (["--allow-client-shm"], True), (["--allow-client-shm=true"], True),
        (["--allow-client-shm=false"], False), (["--allow-client-shm", "0"], False),
    ])
    def test_allow_client_shm_as_triton_spells_it(self, flags: list[str], allowed: bool) -> None:
        settings = modelhost_settings(["serve", *flags, "--client-shm-max-bytes", "1GiB"], {})
        assert (settings.allow_client_shm, settings.client_shm_max_bytes) == (allowed, GIB)

    def test_allow_client_shm_takes_only_true_or_false(self, capsys: pytest.CaptureFixture[str]) -> None:
        assert "must be true or false, got 'yes'" in serve_error(capsys, ["serve", "--allow-client-shm=yes"], {})

    def test_model_repository_is_a_string(self, tmp_path: Path) -> None:
        assert modelhost_settings(["serve", "--model-repository", str(tmp_path)], {}).model_repository == str(tmp_path)

    def test_environment_applies(self) -> None:
        environ = {"SAGEMAKER_BIND_TO_PORT": "9000", "SAGEMAKER_TFS_ENABLE_BATCHING": "true"}
        settings = modelhost_settings(["serve"], environ)
        assert settings.sagemaker_port == 9000
        assert settings.model_overrides == ModelOverrides(
            dynamic_batching=True, max_batch_size=8, max_queue_delay_microseconds=1000)

    def test_an_explicit_flag_beats_the_environment(self) -> None:
        environ = {"SAGEMAKER_BIND_TO_PORT": "9000", "SAGEMAKER_MULTI_MODEL": "true",
                   "SAGEMAKER_MODEL_SERVER_TIMEOUT": "90"}
        settings = modelhost_settings(["serve", "--sagemaker-port", "8080", "--no-multi-model",
                                       "--invocation-timeout-seconds", "60"], environ)
        # the flags name the default values: they still win
        assert (settings.sagemaker_port, settings.multi_model, settings.invocation_timeout_seconds) == (8080, False, 60)

    def test_workers_flag_beats_instance_count(self) -> None:
        assert modelhost_settings(["serve", "--workers", "1"], {"SAGEMAKER_TFS_INSTANCE_COUNT": "3"}).workers == 1
        assert modelhost_settings(["serve"], {"SAGEMAKER_TFS_INSTANCE_COUNT": "3"}).workers == 3

    def test_model_name_flag_beats_the_default_model_name_variable(self) -> None:
        environ = {"SAGEMAKER_TFS_DEFAULT_MODEL_NAME": "from-env"}
        assert modelhost_settings(["serve", "--model-name", "add-sub"], environ).default_model_name == "add-sub"
        assert modelhost_settings(["serve"], environ).default_model_name == "from-env"

    def test_a_bad_variable_exits_2_naming_it(self, capsys: pytest.CaptureFixture[str]) -> None:
        err = serve_error(capsys, ["serve"], {"SAGEMAKER_MULTI_MODEL": "maybe"})
        assert "SAGEMAKER_MULTI_MODEL='maybe' must be true or false" in err

    def test_a_bad_size_exits_2(self, capsys: pytest.CaptureFixture[str]) -> None:
        err = serve_error(capsys, ["serve", "--model-cache-bytes", "12XB"], {})
        assert "--model-cache-bytes" in err and "'12XB' is not a size in bytes" in err

    def test_workers_with_multi_model_exit_2(self, capsys: pytest.CaptureFixture[str]) -> None:
        err = serve_error(capsys, ["serve", "--workers", "2", "--multi-model"], {})
        assert "cannot be combined with multi-model mode" in err

    def test_container_directories_are_not_used(self, tmp_path: Path) -> None:
        (tmp_path / "model").mkdir()
        assert modelhost_settings(["serve"], {"SAGEMAKER_BASE_DIR": str(tmp_path)}).model_repository is None


class TestServe:
    @pytest.mark.parametrize("argv", [[], ["serve"]])
    def test_what_sagemaker_runs(self, argv: list[str]) -> None:
        settings = serve_settings(argv, {})
        assert settings.host == "0.0.0.0"
        assert (settings.http_port, settings.sagemaker_port, settings.max_unpacked_bytes) == (8000, 8080, 16 * GIB)

    @pytest.mark.parametrize("argv", [["--http-port", "9001"], ["serve", "--http-port", "9001"]])
    def test_flags_with_or_without_the_serve_argument(self, argv: list[str]) -> None:
        assert serve_settings(argv, {}).http_port == 9001

    def test_host_flag_beats_the_container_default(self) -> None:
        assert serve_settings(["--host", "127.0.0.1"], {}).host == "127.0.0.1"

    def test_single_model_directory(self, tmp_path: Path) -> None:
        environ = {"SAGEMAKER_BASE_DIR": str(tmp_path)}
        assert serve_settings(["serve"], environ).model_repository is None  # not there: nothing to default to
        (tmp_path / "model").mkdir()
        assert serve_settings(["serve"], environ).model_repository == str(tmp_path / "model")

    def test_multi_model_directory(self, tmp_path: Path) -> None:
        (tmp_path / "model").mkdir()
        (tmp_path / "models").mkdir()
        environ = {"SAGEMAKER_BASE_DIR": str(tmp_path), "SAGEMAKER_MULTI_MODEL": "true"}
        settings = serve_settings(["serve"], environ)
        assert settings.multi_model and settings.model_repository == str(tmp_path / "models")
        flagged = serve_settings(["serve", "--multi-model"], {"SAGEMAKER_BASE_DIR": str(tmp_path)})
        assert flagged.model_repository == str(tmp_path / "models")

    def test_an_explicit_repository_wins(self, tmp_path: Path) -> None:
        (tmp_path / "model").mkdir()
        settings = serve_settings(["serve", "--model-repository", "/srv/models"], {"SAGEMAKER_BASE_DIR": str(tmp_path)})
        assert settings.model_repository == "/srv/models"

    def test_sagemaker_variables(self) -> None:
        settings = serve_settings(["serve"], {"SAGEMAKER_BIND_TO_PORT": "8081", "SAGEMAKER_TS_BATCH_SIZE": "4"})
        assert settings.sagemaker_port == 8081
        assert settings.model_overrides.max_batch_size == 4

    def test_errors_exit_2(self, capsys: pytest.CaptureFixture[str]) -> None:
        err = serve_error(capsys, ["serve"], {"SAGEMAKER_TS_MIN_WORKERS": "4", "SAGEMAKER_TS_MAX_WORKERS": "2"},
                          entry=serve_settings)
        assert err.startswith("usage: serve") and "SAGEMAKER_TS_MIN_WORKERS='4' is more than" in err

    def test_unknown_arguments_exit_2(self, capsys: pytest.CaptureFixture[str]) -> None:
        assert "unrecognized arguments: train" in serve_error(capsys, ["train"], {}, entry=serve_settings)


def test_serve_main_exits_2_before_starting(tmp_path: Path) -> None:
    """The real entry function in a real process: a bad environment stops it with argparse's code."""
    result = subprocess.run(
        [sys.executable, "-c", "import sys; from modelhost.cli import serve_main; sys.exit(serve_main())", "serve"],
        capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "SAGEMAKER_BIND_TO_PORT": "eighty", "HOME": str(tmp_path)},
    )
    assert result.returncode == 2, result.stderr
    assert "SAGEMAKER_BIND_TO_PORT='eighty'" in result.stderr


class TestModelLocationsAndUserCode:
    def test_defaults(self) -> None:
        settings = modelhost_settings(["serve"], {})
        assert (settings.user_code, settings.allow_model_load_from) == ("repository", ())
        assert model_load_roots(settings) == (Path("/opt/ml/models"),)

    def test_flags_and_environment(self, tmp_path: Path) -> None:
        argv = ["serve", "--user-code", "none", "--allow-model-load-from", "/srv/a",
                "--allow-model-load-from", "/srv/b", "--model-repository", str(tmp_path)]
        settings = modelhost_settings(argv, {"SAGEMAKER_BASE_DIR": "/data/ml"})
        assert settings.user_code == "none" and settings.allow_model_load_from == ("/srv/a", "/srv/b")
        assert model_load_roots(settings) == (Path("/data/ml/models"), tmp_path, Path("/srv/a"), Path("/srv/b"))
        s3 = modelhost_settings(["serve", "--multi-model", "--model-repository", "s3://bucket/models"], {})
        assert model_load_roots(s3) == (Path("/opt/ml/models"),)  # an S3 prefix is no local directory

    def test_invalid(self, capsys: pytest.CaptureFixture[str]) -> None:
        assert "--user-code" in serve_error(capsys, ["serve", "--user-code", "some"], {})
        assert "absolute directory" in serve_error(capsys, ["serve", "--allow-model-load-from", "rel/dir"], {})
