"""Device profiles (cost_models/devices/*.yaml), their loader and Cluster validation."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from autopar.errors import AutoparError, DeviceError
from autopar.hardware import (
    PRECISIONS,
    Cluster,
    DeviceProfile,
    list_devices,
    load_cluster,
    load_device,
)

EXPECTED_IDS = {
    "cerebras-cs3",
    "gaudi2",
    "gh200",
    "groq-lpu",
    "l40s",
    "mi250-gcd",
    "mi355x",
    "sn40l",
    "tpu-v5e",
    "a100-40gb",
    "a100-80gb",
    "a100-pcie-80gb",
    "h100-sxm-80gb",
    "h100-sxm-96gb",
    "h800-sxm-80gb",
    "h200-sxm-141gb",
    "b200",
    "b300",
    "gb200-nvl72",
    "gb300-nvl72",
    "tpu-v4",
    "mi300x",
    "mi325x",
    "gaudi3",
    "tpu-v5p",
    "h20",
    "l20",
}

# Golden values from shared/data/hardware.md §2.1 (dense TFLOP/s, GB, GB/s, W).
GOLDEN = {
    # id: (bf16, fp8 or None, memory_gb, memory_bw_gbps, scale_up agg, per-peer, domain, tdp_w)
    # memory_gb is decimal GB as the driver reports it: NVIDIA's and AMD's labels are GiB.
    "a100-40gb": (312, None, 42.95, 1555, 300, 300, 8, 400),
    "a100-80gb": (312, None, 85.9, 2039, 300, 300, 8, 400),
    "h100-sxm-80gb": (989, 1979, 85.52, 3350, 450, 450, 8, 700),
    "h200-sxm-141gb": (989, 1979, 150.76, 4800, 450, 450, 8, 700),
    "b200": (2250, 4500, 180, 8000, 900, 900, 8, 1000),
    "gb200-nvl72": (2500, 5000, 186, 8000, 900, 900, 72, 1200),
    "mi300x": (1307.4, 2614.9, 206.16, 5300, 448, 64, 8, 750),
    "mi325x": (1307.4, 2614.9, 274.88, 6000, 448, 64, 8, 1000),
    "gaudi3": (1677, 1677, 128, 3700, 525, 75, 8, 900),
}

# hardware.md MAMF / busbw measurements that profiles must carry unchanged.
GOLDEN_EFF = {
    # GEMM rates of the NVIDIA parts AIConfigurator measured: autopar's shape law fitted to its tables
    # (studies/gemm_rates.py; re-derived by tests/test_gemm_rates.py); the others: MAMF (hardware.md).
    "a100-80gb": {"gemm.bf16": 0.936, "gemm_half_dim": 262.0, "scale_up_bus": 0.78},
    "h100-sxm-80gb": {"gemm.bf16": 0.834, "gemm.fp8": 0.752, "gemm_half_dim": 144.0, "scale_up_bus": 0.82},
    "h200-sxm-141gb": {"gemm.fp8": 0.769},
    "b200": {"gemm.bf16": 0.71, "gemm.fp8": 0.734, "gemm.mxfp8": 0.738, "scale_out_bus": 0.73},
    "gb200-nvl72": {"gemm.bf16": 0.678, "gemm.fp8": 0.702, "gemm.nvfp4": 0.534},
    "mi300x": {"gemm.bf16": 0.514, "scale_up_bus": 0.70},
    "mi325x": {"gemm.bf16": 0.604},
    "gaudi3": {"gemm.bf16": 0.741, "gemm.fp8": 0.769},
}


def _eff(profile: DeviceProfile, key: str) -> float:
    if key.startswith("gemm."):
        return profile.efficiency.gemm[key.split(".", 1)[1]]
    return getattr(profile.efficiency, key)


def _builtin_yaml(device_id: str) -> str:
    root = Path(__file__).resolve().parent.parent / "cost_models" / "devices"
    return (root / f"{device_id}.yaml").read_text()


# ------------------------------------------------------------------------------------ catalogue


def test_list_devices_is_exactly_the_catalogue():
    assert set(list_devices()) == EXPECTED_IDS
    assert list_devices() == sorted(list_devices())


@pytest.mark.parametrize("device_id", sorted(EXPECTED_IDS))
def test_every_profile_loads_and_is_sane(device_id):
    p = load_device(device_id)
    assert isinstance(p, DeviceProfile)
    assert p.id == device_id
    assert set(p.peak_tflops) <= set(PRECISIONS) and "bf16" in p.peak_tflops
    # every efficiency has its peak: the block-scaled formats run at the FP8 (mxfp8) and FP4 (nvfp4) one
    assert {p.resolve_precision(k) for k in p.efficiency.gemm} <= set(p.peak_tflops)
    assert p.scale_up.per_peer_gbps <= p.scale_up.agg_gbps
    assert 0 <= p.power.idle_w < p.power.tdp_w
    assert p.memory_bytes == pytest.approx(p.memory_gb * 1e9)
    # fp8 (where present) is at least as fast as bf16; fp32 slower; fp16 never faster than bf16 here
    if "fp8" in p.peak_tflops:
        assert p.peak_tflops["fp8"] >= p.peak_tflops["bf16"]
    if "fp32" in p.peak_tflops:  # not published for SRAM/dataflow/TPU parts
        assert p.peak_tflops["fp32"] < p.peak_tflops["bf16"]
    assert p.peak_flops("bf16") == pytest.approx(p.peak_tflops["bf16"] * 1e12)


@pytest.mark.parametrize("device_id", sorted(EXPECTED_IDS))
def test_every_numeric_field_has_provenance(device_id):
    p = load_device(device_id)
    numeric = p.numeric_fields()
    # the check must actually cover the nested fields
    assert {
        "peak_tflops.bf16",
        "scale_up.agg_gbps",
        "power.node_overhead_w",
        "efficiency.gemm.bf16",
        "efficiency.gemm_half_dim",
        "efficiency.attention",
    } <= set(numeric)
    assert p.missing_provenance() == []
    for path in numeric:
        assert len(p.provenance[path].strip()) > 5, path


@pytest.mark.parametrize("device_id", sorted(EXPECTED_IDS))
def test_shipped_yaml_states_every_number_explicitly_with_src(device_id):
    """No default is silently inherited: every numeric leaf is written as {value, src} in the file."""
    raw = yaml.safe_load(_builtin_yaml(device_id))

    def walk(node, path):
        if isinstance(node, dict):
            if "value" in node:
                assert set(node) == {"value", "src"}, path
                assert str(node["src"]).strip(), path
                return
            for k, v in node.items():
                walk(v, f"{path}.{k}" if path else k)
        else:
            assert not isinstance(node, int | float) or isinstance(node, bool), f"{path} has no src"

    walk(raw, "")
    for path in load_device(device_id).numeric_fields():
        node = raw
        for key in path.split("."):
            node = node[key]
        assert isinstance(node, dict) and "value" in node, f"{path} relies on a default"


@pytest.mark.parametrize("device_id", sorted(GOLDEN))
def test_golden_values_match_hardware_md(device_id):
    bf16, fp8, mem, bw, agg, peer, domain, tdp = GOLDEN[device_id]
    p = load_device(device_id)
    assert p.peak_tflops["bf16"] == pytest.approx(bf16)
    if fp8 is None:
        assert "fp8" not in p.peak_tflops
    else:
        assert p.peak_tflops["fp8"] == pytest.approx(fp8)
    assert p.memory_gb == pytest.approx(mem)
    assert p.memory_bw_gbps == pytest.approx(bw)
    assert (p.scale_up.agg_gbps, p.scale_up.per_peer_gbps, p.scale_up.domain) == (agg, peer, domain)
    assert p.power.tdp_w == pytest.approx(tdp)


@pytest.mark.parametrize("device_id", sorted(GOLDEN_EFF))
def test_golden_measured_efficiencies(device_id):
    p = load_device(device_id)
    for key, value in GOLDEN_EFF[device_id].items():
        assert _eff(p, key) == pytest.approx(value), key


def test_h100_peak_flops_and_fp16_fallback():
    p = load_device("h100-sxm-80gb")
    assert p.peak_flops("bf16") == pytest.approx(989e12)
    assert p.peak_flops("fp8") == pytest.approx(1979e12)
    assert p.peak_flops("FP16") == pytest.approx(989e12)
    assert p.peak_flops("mxfp8") == p.peak_flops("fp8")
    assert p.gemm_efficiency("fp8") == pytest.approx(0.752)


def test_fp16_falls_back_to_bf16_when_absent():
    p = load_device("tpu-v4")
    assert "fp16" not in p.peak_tflops
    assert p.peak_flops("fp16") == p.peak_flops("bf16")


def test_gaudi3_uses_the_shipping_clock_and_slow_fp16():
    p = load_device("gaudi3")
    assert p.peak_tflops["bf16"] == 1677  # not the 1,835 spec
    assert p.peak_tflops["fp16"] < p.peak_tflops["bf16"] / 3  # fp16 matrix is 1/4 rate on Gaudi 3
    assert "1.6 GHz" in p.provenance["peak_tflops.bf16"]


def test_fp8_on_a100_raises_naming_device_and_precision():
    with pytest.raises(DeviceError) as exc:
        load_device("a100-80gb").peak_flops("fp8")
    msg = str(exc.value)
    assert "a100-80gb" in msg and "fp8" in msg and "bf16" in msg  # hint lists what exists
    with pytest.raises(DeviceError, match="fp4"):
        load_device("h100-sxm-80gb").peak_flops("nvfp4")
    with pytest.raises(DeviceError, match="unknown precision 'int3'"):
        load_device("h100-sxm-80gb").peak_flops("int3")


def test_per_peer_below_aggregate_for_meshes_and_equal_for_nvswitch():
    for dev in ("mi300x", "mi325x", "gaudi3", "tpu-v4", "tpu-v5p"):
        su = load_device(dev).scale_up
        assert su.per_peer_gbps < su.agg_gbps and not su.switched, dev
    mi = load_device("mi300x").scale_up
    assert mi.agg_gbps / mi.per_peer_gbps == pytest.approx(7.0)
    for dev in ("a100-80gb", "h100-sxm-80gb", "h800-sxm-80gb", "b200", "gb300-nvl72"):
        su = load_device(dev).scale_up
        assert su.per_peer_gbps == su.agg_gbps and su.switched, dev


def test_device_specific_facts():
    h800, h100 = load_device("h800-sxm-80gb"), load_device("h100-sxm-80gb")
    assert h800.scale_up.agg_gbps == 200 and h800.peak_tflops == h100.peak_tflops
    assert load_device("h100-sxm-96gb").memory_bw_gbps == pytest.approx(2400)
    assert load_device("a100-80gb").scale_up.nvls is False and h100.scale_up.nvls is True
    assert load_device("gb300-nvl72").scale_up.domain == 72
    assert load_device("gb300-nvl72").memory_gb == 288
    b300 = load_device("b300")
    assert b300.peak_tflops["bf16"] == 2250 and b300.scale_out.per_device_gbps == 100
    v4 = load_device("tpu-v4")
    assert v4.scale_up.domain == 64 and v4.memory_gb == pytest.approx(32 * 2**30 / 1e9, rel=1e-3)
    assert "fp8" not in v4.peak_tflops
    assert load_device("tpu-v5p").peak_tflops["bf16"] == 459


def test_estimates_are_marked():
    # values the catalogue could not source must say so
    assert load_device("h100-sxm-96gb").provenance["memory_bw_gbps"].startswith("estimate")
    assert load_device("tpu-v5p").provenance["power.tdp_w"].startswith("estimate")
    assert load_device("b300").provenance["peak_tflops.fp4"].startswith("estimate")


def test_ids_are_case_insensitive_and_cached():
    assert load_device("H100-SXM-80GB") is load_device("h100-sxm-80gb")
    assert load_device("  Mi300X ") is load_device("mi300x")


def test_profiles_are_frozen_and_hashable():
    p = load_device("b200")
    with pytest.raises(Exception):  # noqa: B017 - pydantic raises ValidationError on frozen assignment
        p.memory_gb = 1.0
    assert hash(p) == hash(load_device("b200").model_copy())
    assert len({p, load_device("b200"), load_device("h100-sxm-80gb")}) == 2


# ------------------------------------------------------------------------------------ errors


def test_unknown_id_names_it_and_lists_known_ids():
    with pytest.raises(DeviceError) as exc:
        load_device("h100")
    msg = str(exc.value)
    assert "'h100'" in msg
    assert "h100-sxm-80gb" in msg and "tpu-v5p" in msg and "mi300x" in msg
    assert isinstance(exc.value, AutoparError)


def test_missing_file_path(tmp_path):
    with pytest.raises(DeviceError, match="not found"):
        load_device(str(tmp_path / "nope.yaml"))


def test_malformed_yaml_names_the_file(tmp_path):
    f = tmp_path / "broken.yaml"
    f.write_text("id: x\npeak_tflops: {bf16: 1\n  memory_gb: [\n")
    with pytest.raises(DeviceError) as exc:
        load_device(str(f))
    assert "broken.yaml" in str(exc.value) and "YAML" in str(exc.value)


def test_non_mapping_yaml(tmp_path):
    f = tmp_path / "list.yaml"
    f.write_text("- 1\n- 2\n")
    with pytest.raises(DeviceError, match="list.yaml.*mapping"):
        load_device(str(f))


def _whatif_dict() -> dict:
    raw = yaml.safe_load(_builtin_yaml("h100-sxm-80gb"))
    raw["id"] = "h100-whatif"
    raw["name"] = "H100 with 2x HBM bandwidth"
    raw["memory_bw_gbps"] = {"value": 6700.0, "src": "what-if: 2x HBM"}
    return raw


@pytest.mark.parametrize(
    ("mutate", "key"),
    [
        (lambda d: d["scale_up"].update(agg_gbps={"value": -5, "src": "x"}), "scale_up.agg_gbps"),
        (lambda d: d["efficiency"].update(gemmm=d["efficiency"].pop("gemm")), "efficiency.gemmm"),
        (lambda d: d.pop("memory_gb"), "memory_gb"),
        (lambda d: d["peak_tflops"].update(int3={"value": 1.0, "src": "x"}), "peak_tflops"),
        (lambda d: d["efficiency"].update(hbm={"value": 1.5, "src": "x"}), "efficiency.hbm"),
        (lambda d: d["scale_up"].update(per_peer_gbps={"value": 900.0, "src": "x"}), "per_peer_gbps"),
        (lambda d: d.update(provenance={"scale_up.agg_gpbs": "typo"}), "scale_up.agg_gpbs"),
        (lambda d: d["power"].update(tdp_w={"value": 700.0}), "power.tdp_w"),
    ],
)
def test_schema_violation_names_file_and_key(tmp_path, mutate, key):
    raw = _whatif_dict()
    mutate(raw)
    f = tmp_path / "bad-profile.yaml"
    f.write_text(yaml.safe_dump(raw))
    with pytest.raises(DeviceError) as exc:
        load_device(str(f))
    msg = str(exc.value)
    assert "bad-profile.yaml" in msg and key in msg


def test_whatif_yaml_path_loads(tmp_path):
    f = tmp_path / "h100-2xhbm.yaml"
    f.write_text(yaml.safe_dump(_whatif_dict()))
    p = load_device(str(f))
    assert p.id == "h100-whatif" and p.memory_bw_gbps == 6700.0
    assert p.provenance["memory_bw_gbps"] == "what-if: 2x HBM"
    assert p.peak_flops("bf16") == pytest.approx(989e12)
    assert load_device(f) is p  # Path objects work and the load is cached
    # an edit is picked up (cache keyed by mtime)
    raw = _whatif_dict()
    raw["memory_bw_gbps"] = {"value": 5000.0, "src": "what-if"}
    f.write_text(yaml.safe_dump(raw))
    import os

    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert load_device(str(f)).memory_bw_gbps == 5000.0


def test_minimal_whatif_with_plain_numbers_gets_provenance_filled(tmp_path):
    f = tmp_path / "tiny.yml"
    f.write_text(
        """
id: tiny
name: Tiny accelerator
vendor: acme
peak_tflops: {bf16: 100, fp8: 200, fp32: 10}
memory_gb: 24
memory_bw_gbps: 1000
scale_up: {fabric: pcie, domain: 4, agg_gbps: 32, per_peer_gbps: 32, switched: true, latency_us: 5}
scale_out: {fabric: ethernet, per_device_gbps: 12.5, latency_us: 20}
power: {tdp_w: 300, idle_w: 30}
efficiency: {gemm: {bf16: 0.7}, scale_up_bus: 0.7, scale_out_bus: 0.7}
provenance: {memory_gb: "vendor sheet"}
"""
    )
    p = load_device(str(f))
    assert p.missing_provenance() == []
    assert p.provenance["memory_gb"] == "vendor sheet"
    assert "unsourced" in p.provenance["memory_bw_gbps"] and "tiny.yml" in p.provenance["memory_bw_gbps"]
    assert p.provenance["efficiency.hbm"].startswith("autopar default")
    assert p.efficiency.hbm == 0.8 and p.efficiency.gemm_half_dim == 1024.0
    assert p.gemm_efficiency("fp8") == 0.7  # falls back to the bf16 efficiency
    assert p.peak_flops("fp16") == pytest.approx(100e12)


def test_duplicate_provenance_is_rejected(tmp_path):
    raw = _whatif_dict()
    raw["provenance"] = {"memory_bw_gbps": "other"}
    f = tmp_path / "dup.yaml"
    f.write_text(yaml.safe_dump(raw))
    with pytest.raises(DeviceError, match="twice"):
        load_device(str(f))


# ------------------------------------------------------------------------------------ clusters


def test_cluster_defaults_to_the_scale_up_domain():
    c = load_cluster("h100-sxm-80gb", 64)
    assert (c.devices_per_node, c.num_nodes) == (8, 8)
    c = load_cluster("GB200-NVL72", 144)
    assert (c.devices_per_node, c.num_nodes) == (72, 2)
    c = load_cluster("gb200-nvl72", 64, devices_per_node=4)  # NVL4 trays used as nodes
    assert c.num_nodes == 16
    c = Cluster(device=load_device("mi300x"), num_devices=16)
    assert c.devices_per_node == 8 and c.num_nodes == 2


def test_cluster_smaller_than_one_domain():
    c = load_cluster("h100-sxm-80gb", 4)
    assert (c.devices_per_node, c.num_nodes) == (4, 1)
    c = load_cluster("gb200-nvl72", 36)
    assert (c.devices_per_node, c.num_nodes) == (36, 1)


def test_cluster_accepts_a_profile_or_a_path(tmp_path):
    c = load_cluster(load_device("b200"), 16)
    assert c.num_nodes == 2
    f = tmp_path / "w.yaml"
    f.write_text(yaml.safe_dump(_whatif_dict()))
    assert load_cluster(str(f), 8).device.id == "h100-whatif"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("h100-sxm-80gb", 0), "at least 1"),
        (("h100-sxm-80gb", -8), "at least 1"),
        (("h100-sxm-80gb", 12), "use 8 or 16 devices, or devices_per_node=6"),
        (("h100-sxm-80gb", 16, 16), "devices_per_node <= 8"),
        (("mi300x", 24, 16), "scale-up domain of 8"),
        (("h100-sxm-80gb", 8, -1), "negative"),
    ],
)
def test_impossible_clusters_raise_device_error_with_a_fix(args, fragment):
    with pytest.raises(DeviceError) as exc:
        load_cluster(*args)
    assert fragment in str(exc.value)


def test_cluster_type_errors_are_device_errors():
    with pytest.raises(DeviceError, match="num_devices"):
        Cluster(device=load_device("a100-80gb"), num_devices="many")


def test_cluster_is_frozen():
    c = load_cluster("a100-80gb", 16)
    with pytest.raises(Exception):  # noqa: B017
        c.num_devices = 8
    assert math.isclose(c.device.peak_flops("bf16"), 312e12)


def test_cluster_devices_per_node_none_means_default():
    c = Cluster(device=load_device("h200-sxm-141gb"), num_devices=32, devices_per_node=None)
    assert (c.devices_per_node, c.num_nodes) == (8, 4)
    assert load_cluster("tpu-v4", 256).num_nodes == 4  # 4x4x4 cubes
