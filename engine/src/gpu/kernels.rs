//! The WGSL kernels (one file each in `shaders/`, loaded with `include_str!`) and the
//! pipeline cache, keyed by (kernel, entry point, overridable constants).
//!
//! A kernel file may start with shared preludes (`shaders/common/*.wgsl`, named in its
//! header's "Preludes:" line): WGSL has no include, so the source given to the device is
//! the preludes followed by the kernel.

use std::sync::Arc;

use super::GpuContext;
use crate::error::{Error, Result};

/// Prelude: deterministic arithmetic (opq, det_exp, div_cr, sqrt_cr, reduce8).
pub const ARITH: &str = include_str!("../../../shaders/common/arith.wgsl");
/// Prelude: exact weight decoding for every stored dtype (wval).
pub const WEIGHTS: &str = include_str!("../../../shaders/common/weights.wgsl");

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    Matmul,
    QuantizeAct,
    QMatmul,
    QMatmulDp4a,
    Embed,
    RmsNorm,
    Rope,
    Attention,
    Swiglu,
    Add,
    Clamp,
    MoeAccumulate,
    GatedAdd,
    Route,
    QuantizeAct16,
    Mxfp4Matmul,
    MlaAbsorb,
    GateMul,
    L2Norm,
    DeltaNetConv,
    DeltaNetGates,
    DeltaRule,
    SplitGate,
    RopePairs,
    LayerNorm,
    IndexScores,
    HcCollapse,
    HcExpand,
    HcWeights,
    RopeTail,
    V4Compress,
    V4Topk,
    V4Attend,
}

impl Kernel {
    pub const ALL: [Kernel; 33] = [
        Kernel::Matmul,
        Kernel::QuantizeAct,
        Kernel::QMatmul,
        Kernel::QMatmulDp4a,
        Kernel::Embed,
        Kernel::RmsNorm,
        Kernel::Rope,
        Kernel::Attention,
        Kernel::Swiglu,
        Kernel::Add,
        Kernel::Clamp,
        Kernel::MoeAccumulate,
        Kernel::GatedAdd,
        Kernel::Route,
        Kernel::QuantizeAct16,
        Kernel::Mxfp4Matmul,
        Kernel::MlaAbsorb,
        Kernel::GateMul,
        Kernel::L2Norm,
        Kernel::DeltaNetConv,
        Kernel::DeltaNetGates,
        Kernel::DeltaRule,
        Kernel::SplitGate,
        Kernel::RopePairs,
        Kernel::LayerNorm,
        Kernel::IndexScores,
        Kernel::HcCollapse,
        Kernel::HcExpand,
        Kernel::HcWeights,
        Kernel::RopeTail,
        Kernel::V4Compress,
        Kernel::V4Topk,
        Kernel::V4Attend,
    ];

    /// File name in shaders/, its preludes, and its text.
    pub fn parts(self) -> (&'static str, &'static [&'static str], &'static str) {
        const NONE: &[&str] = &[];
        const A: &[&str] = &[ARITH];
        const W: &[&str] = &[WEIGHTS];
        const AW: &[&str] = &[ARITH, WEIGHTS];
        match self {
            Kernel::Matmul => ("matmul.wgsl", AW, include_str!("../../../shaders/matmul.wgsl")),
            Kernel::QuantizeAct => ("quantize_act.wgsl", A, include_str!("../../../shaders/quantize_act.wgsl")),
            Kernel::QMatmul => ("qmatmul.wgsl", AW, include_str!("../../../shaders/qmatmul.wgsl")),
            Kernel::QMatmulDp4a => ("qmatmul_dp4a.wgsl", AW, include_str!("../../../shaders/qmatmul_dp4a.wgsl")),
            Kernel::Embed => ("embed.wgsl", W, include_str!("../../../shaders/embed.wgsl")),
            Kernel::RmsNorm => ("rmsnorm.wgsl", A, include_str!("../../../shaders/rmsnorm.wgsl")),
            Kernel::Rope => ("rope.wgsl", A, include_str!("../../../shaders/rope.wgsl")),
            Kernel::Attention => ("attention.wgsl", A, include_str!("../../../shaders/attention.wgsl")),
            Kernel::Swiglu => ("swiglu.wgsl", A, include_str!("../../../shaders/swiglu.wgsl")),
            Kernel::Add => ("add.wgsl", NONE, include_str!("../../../shaders/add.wgsl")),
            Kernel::Clamp => ("clamp.wgsl", NONE, include_str!("../../../shaders/clamp.wgsl")),
            Kernel::MoeAccumulate => ("moe_accumulate.wgsl", A, include_str!("../../../shaders/moe_accumulate.wgsl")),
            Kernel::GatedAdd => ("gated_add.wgsl", A, include_str!("../../../shaders/gated_add.wgsl")),
            Kernel::Route => ("route.wgsl", A, include_str!("../../../shaders/route.wgsl")),
            Kernel::QuantizeAct16 => ("quantize_act16.wgsl", A, include_str!("../../../shaders/quantize_act16.wgsl")),
            Kernel::Mxfp4Matmul => ("mxfp4_matmul.wgsl", A, include_str!("../../../shaders/mxfp4_matmul.wgsl")),
            Kernel::MlaAbsorb => ("mla_absorb.wgsl", AW, include_str!("../../../shaders/mla_absorb.wgsl")),
            Kernel::GateMul => ("gate_mul.wgsl", A, include_str!("../../../shaders/gate_mul.wgsl")),
            Kernel::L2Norm => ("l2norm.wgsl", A, include_str!("../../../shaders/l2norm.wgsl")),
            Kernel::DeltaNetConv => ("deltanet_conv.wgsl", A, include_str!("../../../shaders/deltanet_conv.wgsl")),
            Kernel::DeltaNetGates => ("deltanet_gates.wgsl", A, include_str!("../../../shaders/deltanet_gates.wgsl")),
            Kernel::DeltaRule => ("delta_rule.wgsl", A, include_str!("../../../shaders/delta_rule.wgsl")),
            Kernel::SplitGate => ("split_gate.wgsl", NONE, include_str!("../../../shaders/split_gate.wgsl")),
            Kernel::RopePairs => ("rope_pairs.wgsl", A, include_str!("../../../shaders/rope_pairs.wgsl")),
            Kernel::LayerNorm => ("layernorm.wgsl", A, include_str!("../../../shaders/layernorm.wgsl")),
            Kernel::IndexScores => ("index_scores.wgsl", A, include_str!("../../../shaders/index_scores.wgsl")),
            Kernel::HcCollapse => ("hc_collapse.wgsl", A, include_str!("../../../shaders/hc_collapse.wgsl")),
            Kernel::HcExpand => ("hc_expand.wgsl", A, include_str!("../../../shaders/hc_expand.wgsl")),
            Kernel::HcWeights => ("hc_weights.wgsl", A, include_str!("../../../shaders/hc_weights.wgsl")),
            Kernel::RopeTail => ("rope_tail.wgsl", A, include_str!("../../../shaders/rope_tail.wgsl")),
            Kernel::V4Compress => ("v4_compress.wgsl", A, include_str!("../../../shaders/v4_compress.wgsl")),
            Kernel::V4Topk => ("v4_topk.wgsl", NONE, include_str!("../../../shaders/v4_topk.wgsl")),
            Kernel::V4Attend => ("v4_attend.wgsl", A, include_str!("../../../shaders/v4_attend.wgsl")),
        }
    }

    pub fn name(self) -> &'static str {
        self.parts().0
    }

    /// The complete WGSL given to the device: preludes, then the kernel.
    pub fn source(self) -> String {
        let (_, preludes, body) = self.parts();
        let mut s = String::new();
        for p in preludes {
            s.push_str(p);
            s.push('\n');
        }
        s.push_str(body);
        s
    }
}

/// Pipeline-overridable constants as (name, value) with the value's f64 bits, so the
/// key can be hashed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PipelineKey {
    pub kernel: Kernel,
    pub entry: &'static str,
    pub constants: Vec<(&'static str, u64)>,
}

/// A compiled pipeline and the bind group layout derived from its shader.
pub struct Pipeline {
    pub pipeline: wgpu::ComputePipeline,
    pub layout: wgpu::BindGroupLayout,
}

impl GpuContext {
    /// The pipeline for `kernel`'s `main` with these constants, compiled once per device.
    pub fn pipeline(&self, kernel: Kernel, constants: &[(&'static str, f64)]) -> Result<Arc<Pipeline>> {
        let key = PipelineKey {
            kernel,
            entry: "main",
            constants: constants.iter().map(|(k, v)| (*k, v.to_bits())).collect(),
        };
        let poisoned = || Error::Gpu("pipeline cache poisoned".into());
        if let Some(p) = self.pipelines.lock().map_err(|_| poisoned())?.get(&key) {
            return Ok(p.clone());
        }
        let module = {
            let mut modules = self.modules.lock().map_err(|_| poisoned())?;
            modules
                .entry(kernel)
                .or_insert_with(|| {
                    self.device.create_shader_module(wgpu::ShaderModuleDescriptor {
                        label: Some(kernel.name()),
                        source: wgpu::ShaderSource::Wgsl(kernel.source().into()),
                    })
                })
                .clone()
        };
        let pipeline = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(kernel.name()),
            layout: None,
            module: &module,
            entry_point: Some(key.entry),
            compilation_options: wgpu::PipelineCompilationOptions { constants, zero_initialize_workgroup_memory: true },
            cache: None,
        });
        self.take_error().map_err(|e| Error::Gpu(format!("{}: {e}", kernel.name())))?;
        let layout = pipeline.get_bind_group_layout(0);
        let p = Arc::new(Pipeline { pipeline, layout });
        self.pipelines.lock().map_err(|_| poisoned())?.insert(key, p.clone());
        Ok(p)
    }
}

/// The override constants that select a weight decoder (shaders/common/weights.wgsl).
pub fn dtype_constants(dtype: crate::tensor::DType) -> [(&'static str, f64); 2] {
    use crate::tensor::DType;
    let (code, group) = match dtype {
        DType::F32 => (0, 32),
        DType::BF16 => (1, 32),
        DType::F16 => (2, 32),
        DType::Int8 { group } => (3, group),
        DType::Int4 { group } => (4, group),
        DType::Fp8 { block } => (5, block),
        DType::Q4K => (6, 32),
        DType::Q5K => (7, 32),
        // No WGSL decoder: upload_mat refuses U8 and F8E4M3 before any kernel is built;
        // MXFP4 has its own kernel (mxfp4_matmul.wgsl).
        DType::Mxfp4 | DType::U8 | DType::F8E4M3 => (u32::MAX, 32),
    };
    [("DTYPE", code as f64), ("GROUP", group as f64)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_registered_kernel_validates_as_assembled() {
        for k in Kernel::ALL {
            let src = k.source();
            let module = naga::front::wgsl::parse_str(&src)
                .unwrap_or_else(|e| panic!("{}: {}", k.name(), e.emit_to_string(&src)));
            naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::empty())
                .validate(&module)
                .unwrap_or_else(|e| panic!("{}: {}", k.name(), e.emit_to_string(&src)));
        }
        // Every kernel file in shaders/ is registered here.
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shaders");
        let files = std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "wgsl"))
            .count();
        assert_eq!(files, Kernel::ALL.len());
    }
}
