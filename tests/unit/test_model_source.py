"""The model the deployment serves: NVIDIA's published NVFP4 checkpoint, sized from the real one."""
import yaml

from inventories import group_var
from pdctl.lab import synthetic_model

REAL_GB = 459  # nvidia/GLM-5.2-NVFP4 on disk (about)


def test_production_and_lab_read_nvidias_checkpoint():
    assert group_var("b300", "pdctl_model_source") == "hf://nvidia/GLM-5.2-NVFP4"
    assert group_var("lab", "pdctl_model_source") == "hf://nvidia/GLM-5.2-NVFP4"
    assert synthetic_model.REPO_ID == "nvidia/GLM-5.2-NVFP4"


def test_preflight_disk_check_is_sized_from_the_real_checkpoint():
    size_gb = group_var("b300", "pdctl_model_size_gb")
    assert REAL_GB <= size_gb < REAL_GB * 1.05
    need = size_gb * (1 + group_var("b300", "pdctl_model_disk_margin_pct") / 100)
    assert need >= 500  # 459 GB + margin: a 480 GB volume must fail preflight


def test_lab_synthetic_checkpoint_is_the_real_one_scaled_down(tmp_path):
    info = synthetic_model.build(str(tmp_path / "m"), size_mb=3, shards=3)
    config = yaml.safe_load((tmp_path / "m" / "config.json").read_text())
    assert config["architectures"] == ["GlmMoeDsaForCausalLM"] and config["model_type"] == "glm_moe_dsa"
    assert config["quantization_config"]["quant_method"] == "modelopt"
    assert info["files"] >= 3 + 3
    # The default size is the real checkpoint at 1/300 (a 2 GB lab requirement holds it).
    assert abs(1536 * 300 / 1000 - synthetic_model.REAL_SIZE_GB) / synthetic_model.REAL_SIZE_GB < 0.01


def test_production_engine_installs_flashinfer_kernels_matching_vllms_flashinfer():
    """Offline Blackwell hosts: FlashInfer must not download its cubins at first use (issue 13 item 5)."""
    versions = group_var("b300", "pdctl_versions")
    assert versions["vllm"] == "0.33.0" and versions["flashinfer"] == "0.7.2.post1"  # what vLLM 0.33.0 pins
    packages = group_var("b300", "pdctl_engine")["packages"]
    for name in ("flashinfer-cubin", "flashinfer-jit-cache"):
        assert "%s=={{ pdctl_versions.flashinfer }}" % name in packages
