"""Kernel families over nsys and ncu names."""

from __future__ import annotations

import csv
import warnings
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tracekit import taxonomy
from tracekit.taxonomy import add_rule, classify, kernel_family, reset_rules

from .conftest import SAMPLES


def _sample_exports() -> list[Path]:
    return sorted(p for p in SAMPLES.glob("*/*.sqlite"))


@pytest.mark.parametrize("path", _sample_exports(), ids=lambda p: p.stem)
def test_at_least_95_percent_of_gpu_time_has_a_family(path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        k = tracekit.open(path).kernels  # type: ignore[union-attr]
    fam = classify(k)
    other = fam.filter(pl.col("family") == "other")["duration_ns"].sum()
    assert other <= 0.05 * fam["duration_ns"].sum()
    # same names, same order
    assert fam["name"].to_list() == k["name"].to_list()


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT", "gemm"),
        ("void cublasLt::splitKreduce_kernel<(int)32, (int)16, int, float, __nv_bfloat16>", "gemm"),
        ("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x256x32", "gemm"),
        ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4>(T1::Params)", "gemm"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64", "attention"),
        ("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>(flash::Flash_fwd_params)", "attention"),
        ("void vllm::paged_attention_v2_kernel<__nv_bfloat16, 128>", "attention"),
        ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)", "communication"),
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "communication"),
        ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>", "communication"),
        ("c10d::symmetric_memory::barrier_kernel(unsigned int **, int, int, int, unsigned long)", "communication"),
        ("void at::native::<unnamed>::vectorized_layer_norm_kernel<c10::BFloat16, float, (bool)1>", "normalization"),
        ("void at::native::<unnamed>::cunn_SoftMaxForward<8, float, float, float>", "softmax"),
        ("void at::native::<unnamed>::indexSelectSmallIndex<c10::BFloat16, long, unsigned int>", "embedding"),
        ("void at::native::elementwise_kernel<128, 4, void at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda>>", "copy"),
        ("void at::native::vectorized_elementwise_kernel<8, at::native::FillFunctor<c10::BFloat16>>", "copy"),
        ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::BFloat16, at::native::ArgMaxOps<float>>>", "reduction"),
        ("void at::native::vectorized_elementwise_kernel<8, at::native::<unnamed>::silu_kernel>", "elementwise"),
        ("triton_poi_fused_add_mul_0", "elementwise"),
        # Inductor kernels that only move data (the whole-KV-cache copy of a compiled decode,
        # a cat-grown cache, a layout change) and the templates, norms and reductions
        ("triton_poi_fused_copy_0", "copy"),
        ("triton_poi_fused_cat_3", "copy"),
        ("triton_poi_fused_clone_1", "copy"),
        ("triton_poi_fused__to_copy_unsqueeze_1", "copy"),
        ("triton_poi_fused_add_copy__16", "elementwise"),
        ("triton_tem_fused_mm_0", "gemm"),
        ("triton_per_fused__fused_rms_norm__unsafe_view_add_9", "normalization"),
        ("triton_red_fused__softmax_2", "softmax"),
        ("triton_red_fused_argmax_14", "reduction"),
        # ncu short and mangled forms of the same kernels
        ("vectorized_elementwise_kernel", "elementwise"),
        ("_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEviT0_T1_", "copy"),
        ("_ZN2at6native13reduce_kernelILi512ELi1ENS0_8ReduceOpIfNS0_10ArgMaxOpsIfEEjlLi4ELi4EEEEEvT1_", "reduction"),
        ("par_ranged2d_kernel", "other"),
        (None, "other"),
    ],
)
def test_known_names(name: str | None, family: str) -> None:
    assert kernel_family(name) == family
    assert classify(pl.DataFrame({"name": [name]}, schema={"name": pl.Utf8}))["family"].item() == family


def test_ncu_kernel_names_of_the_samples() -> None:
    names = []
    for raw in sorted((SAMPLES / "ncu").glob("*/*.raw.csv")):
        with raw.open(newline="") as fh:
            rows = list(csv.reader(fh))
        col = rows[0].index("Kernel Name")
        names += [r[col] for r in rows[2:] if len(r) > col and r[col]]
    assert names
    fams = {kernel_family(n) for n in names}
    assert "other" not in fams and {"gemm", "attention"} <= fams


def test_user_rules_come_first() -> None:
    try:
        add_rule("attention", r"^my_fused_block")
        assert kernel_family("my_fused_block_gemm") == "attention"
        frame = classify(pl.DataFrame({"name": ["my_fused_block_gemm", "gemm_x"]}))
        assert frame["family"].to_list() == ["attention", "gemm"]
    finally:
        reset_rules()
    assert kernel_family("my_fused_block_gemm") == "gemm"
    with pytest.raises(ValueError, match="look-around"):
        add_rule("gemm", r"foo(?!bar)")
    assert taxonomy.active_rules() == list(taxonomy.DEFAULT_RULES)
