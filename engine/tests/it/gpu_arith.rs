//! shaders/common/arith.wgsl on a real adapter over a million inputs: div_cr and sqrt_cr
//! are the correctly rounded IEEE results (what Rust computes), det_exp is math::exp
//! bit for bit. Also measures, without asserting, how the adapter's own division, sqrt,
//! inverse sqrt and a*b+c differ from the CPU: the reason these functions exist.
#![cfg(feature = "wgpu")]

use crate::gpu_common::{gpu, ulps, Lcg};
use colibri_engine::gpu::block_on;
use colibri_engine::gpu::buffers::{f32s, upload_f32};
use colibri_engine::gpu::kernels::ARITH;
use colibri_engine::gpu::recorder::Recorder;
use colibri_engine::math;

const PROBE: &str = r#"
struct Params { zero: u32, len: u32, groups_x: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read> B: array<f32>;
@group(0) @binding(3) var<storage, read> C: array<f32>;
@group(0) @binding(4) var<storage, read_write> OUT: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let i = (wg.x + wg.y * P.groups_x) * 64u + li;
    if (i >= P.len) {
        return;
    }
    let a = A[i];
    let b = B[i];
    let c = C[i];
    let n = P.len;
    OUT[i] = div_cr(a, b);
    OUT[n + i] = sqrt_cr(abs(a));
    OUT[2u * n + i] = det_exp(c);
    OUT[3u * n + i] = a / b;
    OUT[4u * n + i] = sqrt(abs(a));
    OUT[5u * n + i] = 1.0 / sqrt(abs(a));
    OUT[6u * n + i] = a * b + c;
    OUT[7u * n + i] = opq(a * b) + c;
}
"#;

/// A random normal f32 with exponent in [lo, hi] (biased).
fn normal(rng: &mut Lcg, lo: u32, hi: u32) -> f32 {
    let b = rng.bits();
    let e = lo + (b >> 9) % (hi - lo + 1);
    f32::from_bits((b & 0x8000_0000) | (e << 23) | (rng.bits() & 0x7f_ffff))
}

fn flush(x: f32) -> f32 {
    if x != 0.0 && x.abs() < f32::MIN_POSITIVE {
        0.0f32.copysign(x)
    } else {
        x
    }
}

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

#[test]
fn division_sqrt_and_exp_are_the_cpu_bits() {
    let Some(ctx) = gpu() else { return };
    let mut rng = Lcg(23);
    let n = 1 << 20;
    // Thirds: any normal / any normal, any normal / moderate, moderate / moderate.
    let mut a: Vec<f32> =
        (0..n).map(|i| if i % 3 == 2 { normal(&mut rng, 120, 130) } else { normal(&mut rng, 1, 254) }).collect();
    let mut b: Vec<f32> =
        (0..n).map(|i| if i % 3 == 0 { normal(&mut rng, 1, 254) } else { normal(&mut rng, 110, 144) }).collect();
    let mut c: Vec<f32> = (0..n).map(|_| rng.next() * 95.0).collect();
    let specials = [
        0.0f32,
        -0.0,
        1.0,
        -1.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MAX,
        f32::MIN_POSITIVE,
        3.0,
        0.1,
        1e-20,
        7.0e30,
    ];
    for (i, &x) in specials.iter().enumerate() {
        for (j, &y) in specials.iter().enumerate() {
            let k = i * specials.len() + j;
            a[k] = x;
            b[k] = y;
            c[k] =
                [0.0, -0.0, 88.72283, 88.72284, -87.33654, -87.33655, f32::NAN, 1e-8, -1e-8, 100.0, -100.0, 0.5, -0.5]
                    [j];
        }
    }
    let (ab, bb, cb) =
        (upload_f32(&ctx, "a", &a).unwrap(), upload_f32(&ctx, "b", &b).unwrap(), upload_f32(&ctx, "c", &c).unwrap());
    let out = ctx.storage_buffer("out", 8 * n as u64 * 4).unwrap();

    let module = ctx.device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("arith probe"),
        source: wgpu::ShaderSource::Wgsl(format!("{ARITH}\n{PROBE}").into()),
    });
    let pipeline = ctx.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("arith probe"),
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    let groups = (n / 64) as u32;
    let params: Vec<u8> = [0u32, n as u32, groups, 0].iter().flat_map(|w| w.to_le_bytes()).collect();
    let params_buf = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("params"),
        size: 16,
        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    ctx.queue.write_buffer(&params_buf, 0, &params);
    let entries: Vec<wgpu::BindGroupEntry> = [&params_buf, &ab, &bb, &cb, &out]
        .iter()
        .enumerate()
        .map(|(i, b)| wgpu::BindGroupEntry { binding: i as u32, resource: b.as_entire_binding() })
        .collect();
    let bg = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &pipeline.get_bind_group_layout(0),
        entries: &entries,
    });
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bg, &[]);
        pass.dispatch_workgroups(groups, 1, 1);
    }
    ctx.queue.submit([enc.finish()]);
    let mut rec = Recorder::new(&ctx);
    rec.read(&out, 0, 8 * n as u64 * 4);
    let r = f32s(&block_on(rec.submit()).unwrap()[0]);
    let col = |k: usize| &r[k * n..(k + 1) * n];

    let mut bad = Vec::new();
    let mut native = [0usize; 5];
    let mut native_worst = [0u64; 5];
    for i in 0..n {
        let (x, y, z) = (a[i], b[i], c[i]);
        let checks = [
            ("div_cr", col(0)[i], flush(x / y)),
            ("sqrt_cr", col(1)[i], flush(x.abs().sqrt())),
            ("det_exp", col(2)[i], flush(math::exp(z))),
            ("opq(a*b)+c", col(7)[i], flush(x * y + z)),
        ];
        for (what, g, w) in checks {
            // Subnormal inputs are zero on the GPU (WGSL allows flushing); skip them.
            let sub = |v: f32| v != 0.0 && v.abs() < f32::MIN_POSITIVE;
            if !same(g, w) && !sub(x) && !sub(y) && bad.len() < 8 {
                bad.push(format!("{what}({x:e}, {y:e}, {z:e}): gpu {g:e} cpu {w:e}"));
            }
        }
        let finite = |v: f32| v.is_finite() && v.abs() >= f32::MIN_POSITIVE;
        let natives = [
            (col(3)[i], x / y),
            (col(4)[i], x.abs().sqrt()),
            (col(5)[i], 1.0 / x.abs().sqrt()),
            (col(6)[i], x * y + z),
            (col(7)[i], x * y + z),
        ];
        for (k, (g, w)) in natives.into_iter().enumerate() {
            if finite(g) && finite(w) && g != w {
                native[k] += 1;
                native_worst[k] = native_worst[k].max(ulps(g, w));
            }
        }
    }
    eprintln!("{}: adapter built-ins vs the CPU over {n} inputs (count differing, worst ulp):", ctx.adapter_name);
    for (k, name) in ["a / b", "sqrt(a)", "1.0 / sqrt(a)", "a * b + c", "opq(a * b) + c"].iter().enumerate() {
        eprintln!("  {name:16} {:8} differ, worst {} ulp", native[k], native_worst[k]);
    }
    assert!(bad.is_empty(), "arith.wgsl differs from the CPU: {}", bad.join("; "));
}
