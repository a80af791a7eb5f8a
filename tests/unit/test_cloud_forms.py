"""SkyPilot resource forms that name cloud machines and offers: an instance type asks for the
GPUs it carries (never silently none), and any_of entries that choose only cloud offers leave
the accelerators' alternatives standing."""

from __future__ import annotations

import pytest

from corral.spec import SpecError, load_job


def _resources(text: str):
    loaded = load_job(text)
    return loaded.spec.tasks[0].resources, loaded.warnings


@pytest.mark.parametrize("instance, gpu", [("p4d.24xlarge", ("A100", 8)), ("a3-highgpu-8g", ("H100", 8)),
                                           ("Standard_ND96amsr_A100_v4", ("A100-80GB", 8)),
                                           ("g5.12xlarge", ("A10G", 4)), ("gpu_8x_h100_sxm5", ("H100", 8))])
def test_a_gpu_instance_type_asks_for_its_gpus(instance: str, gpu: tuple[str, int]) -> None:
    resources, warnings = _resources(f"resources: {{instance_type: {instance}}}\nrun: x\n")
    assert (resources.gpu_type, resources.gpus) == gpu
    assert any(instance in w and f"{gpu[0]}:{gpu[1]}" in w for w in warnings)


def test_accelerators_beside_an_instance_type_say_what_the_job_needs() -> None:
    resources, warnings = _resources("resources: {instance_type: p4d.24xlarge, accelerators: A100:2}\nrun: x\n")
    assert (resources.gpu_type, resources.gpus) == ("A100", 2) and any("is ignored" in w for w in warnings)


def test_a_cpu_instance_type_is_ignored_with_a_warning() -> None:
    resources, warnings = _resources("resources: {instance_type: m5.2xlarge, cpus: 4}\nrun: x\n")
    assert resources.gpus == 0 and resources.cpus == 4 and any("instance_type" in w for w in warnings)


def test_an_unknown_gpu_instance_type_is_refused_never_run_without_gpus() -> None:
    with pytest.raises(SpecError) as refused:
        load_job("resources: {instance_type: p9.99xlarge}\nrun: x\n")
    assert "p9.99xlarge" in str(refused.value) and "resources.accelerators" in str(refused.value)


def test_any_of_choosing_only_cloud_offers_keeps_the_accelerators_alternatives() -> None:
    # the shape of a real DeepSeek-R1 serving file: several GPU kinds, spot or on-demand
    resources, warnings = _resources("resources:\n  accelerators: {H100:8, H200:8, B200:8}\n  any_of:\n"
                                     "    - use_spot: true\n    - use_spot: false\nrun: x\n")
    assert [a.accelerators for a in resources.alternatives] == [("H100", 8), ("H200", 8), ("B200", 8)]
    assert not resources.in_order and any("use_spot" in w for w in warnings)


def test_any_of_naming_other_accelerators_beside_accelerators_is_still_refused() -> None:
    with pytest.raises(SpecError) as refused:
        load_job("resources:\n  accelerators: {H100:8, H200:8}\n  any_of:\n    - {accelerators: A100:8}\nrun: x\n")
    assert "not both" in str(refused.value)


def test_job_recovery_restarts_on_errors_become_the_restart_policy() -> None:
    loaded = load_job("resources:\n  job_recovery: {strategy: FAILOVER, max_restarts_on_errors: 3}\nrun: x\n")
    restart = loaded.spec.tasks[0].restart
    assert (restart.policy, restart.max_restarts, restart.exit_codes) == ("on_failure", 3, None)
    assert any("FAILOVER" in w for w in loaded.warnings) and any("up to 3 times" in w for w in loaded.warnings)
    codes = load_job("resources:\n  spot_recovery: {recover_on_exit_codes: [33, 34]}\nrun: x\n").spec.tasks[0].restart
    assert codes.policy == "on_failure" and codes.exit_codes == [33, 34]
    assert codes.should_restart(33, 0) and not codes.should_restart(1, 0)
    plain = load_job("resources:\n  job_recovery: FAILOVER\nrun: x\n").spec.tasks[0].restart
    assert plain.policy == "never"  # a strategy alone asks nothing of the replica's own failures


@pytest.mark.parametrize("recovery, words", [("{max_restarts_on_errors: -1}", "max_restarts_on_errors"),
                                             ("{strategy: SIDEWAYS}", "strategy"),
                                             ("{recover_on_exit_codes: [0]}", "recover_on_exit_codes"),
                                             ("{retries: 2}", "unknown field")])
def test_bad_job_recovery_is_refused_naming_the_field(recovery: str, words: str) -> None:
    with pytest.raises(SpecError) as refused:
        load_job(f"resources:\n  job_recovery: {recovery}\nrun: x\n")
    assert words in str(refused.value) and "job_recovery" in str(refused.value)


def test_restart_and_job_recovery_together_are_refused() -> None:
    with pytest.raises(SpecError) as refused:
        load_job("restart: {policy: always}\nresources:\n  job_recovery: {max_restarts_on_errors: 2}\nrun: x\n")
    assert "not both" in str(refused.value)


def test_cloud_only_service_fields_are_warnings_not_refusals() -> None:
    loaded = load_job("service:\n  readiness_probe: /health\n  replicas: 2\n  ports: 8080\n"
                      "  external_load_balancers: [{resources: {cloud: aws}}]\nrun: x\n")
    assert loaded.spec.tasks[0].num_nodes == 2
    assert any("external_load_balancers" in w for w in loaded.warnings)
    with pytest.raises(SpecError):  # a field corral does not know at all is still an error
        load_job("service:\n  readiness_probe: /health\n  replicaz: 2\n  ports: 8080\nrun: x\n")


def test_envs_and_secrets_a_process_could_not_start_with_are_refused_at_submission() -> None:
    big = "x" * (200 * 1024)
    with pytest.raises(SpecError) as refused:
        load_job("name: t\nrun: x\n", secrets={"S": big})
    assert "envs" in str(refused.value) and "KiB" in str(refused.value)
    many = {f"V{i}": "1" for i in range(5000)}
    with pytest.raises(SpecError) as refused:
        load_job("name: t\nrun: x\n", env=many)
    assert "5000 variables" in str(refused.value)
    assert load_job("name: t\nrun: x\n", env={"A": "1"}, secrets={"S": "2"}).spec.tasks[0].secrets == {"S": "2"}


@pytest.mark.parametrize("value", ["[a, b]", "12", "'" + "x" * 200 + "'"])
def test_an_instance_type_that_is_not_a_name_is_refused(value: str) -> None:
    with pytest.raises(SpecError) as refused:
        load_job(f"resources: {{instance_type: {value}}}\nrun: x\n")
    assert "instance_type" in str(refused.value)


def test_port_names_that_differ_only_in_case_are_refused() -> None:
    with pytest.raises(SpecError) as refused:
        load_job("name: t\nports: {http: 8000, HTTP: 8001}\nrun: x\n")
    assert "CORRAL_PORT_HTTP" in str(refused.value)


def test_a_skypilot_pool_file_is_refused_with_what_to_do_instead() -> None:
    with pytest.raises(SpecError) as err:
        load_job("pool:\n  workers: 3\nresources:\n  accelerators: H100:1\nsetup: pip install vllm\n")
    issue = err.value.issues[0]
    assert issue.line == 1 and "worker pool" in issue.message and "corral launch" in issue.message


def test_a_skyserve_replica_is_replaced_whenever_it_ends_unless_the_file_says_otherwise() -> None:
    serve = "service: {readiness_probe: /, replicas: 2}\nresources: {ports: 8080%s}\nrun: python3 -m http.server 8080\n"
    restart = load_job(serve % "").spec.tasks[0].restart
    assert restart.policy == "always" and restart.should_restart(0, 500) and restart.should_restart(1, 500)
    recovery = load_job(serve % ", job_recovery: {max_restarts_on_errors: 2}").spec.tasks[0].restart
    assert recovery.policy == "on_failure" and recovery.max_restarts == 2
    own = load_job(serve % "" + "restart: {policy: never}\n").spec.tasks[0].restart
    assert own.policy == "never"


def test_an_endpoint_beside_a_service_is_read_not_dropped() -> None:
    serve = ("service: {readiness_probe: /, replica_policy: {min_replicas: 0, max_replicas: 2, "
             "target_qps_per_replica: 1}}\nresources: {ports: 8080}\nrun: x\nendpoint: %s\n")
    assert load_job(serve % "{hold: 45s}").spec.tasks[0].endpoint.hold == 45
    for bad in ("{hold: -5s}", "{port: 9000}"):
        with pytest.raises(SpecError) as refused:
            load_job(serve % bad)
        assert "endpoint" in str(refused.value)
