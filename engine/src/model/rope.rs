//! Rotary position embedding (RoPE) as Hugging Face computes it, with the scaling
//! variants of `rope_parameters` (transformers v5) / `rope_scaling` (v4):
//! default, linear, yarn and llama3. Frequencies follow transformers' float32 recipe;
//! the cosines themselves come from `libm` in f64 so every platform agrees bit for bit.

use serde_json::Value;

use crate::error::{Error, Result};

#[derive(Clone, Debug, PartialEq)]
pub enum RopeKind {
    Default,
    Linear {
        factor: f32,
    },
    Yarn {
        factor: f64,
        original_max: usize,
        beta_fast: f64,
        beta_slow: f64,
        attention_factor: Option<f64>,
        mscale: Option<f64>,
        mscale_all_dim: Option<f64>,
        truncate: bool,
    },
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max: usize,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct RopeConfig {
    pub theta: f64,
    /// Number of leading dimensions of each head that are rotated (partial RoPE).
    pub rotary_dim: usize,
    pub kind: RopeKind,
}

fn num(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64)
}

/// The rope parameters object: `rope_parameters` (v5), else `rope_scaling` (v4).
fn rope_params(cfg: &Value) -> Option<&Value> {
    cfg.get("rope_parameters").filter(|p| p.is_object()).or_else(|| cfg.get("rope_scaling").filter(|p| p.is_object()))
}

/// The extra softmax-scale factor of deepseek_v3's attention (transformers'
/// `yarn_apply_mscale`): with a rope type other than default and a non-zero
/// `mscale_all_dim`, q.k is scaled by mscale^2 on top of head_dim^-0.5, where
/// mscale = 0.1 * mscale_all_dim * ln(factor) + 1 (1 when factor <= 1). 1 otherwise.
pub fn softmax_mscale(cfg: &Value) -> Result<f64> {
    let Some(params) = rope_params(cfg) else { return Ok(1.0) };
    let rope_type = params.get("rope_type").or_else(|| params.get("type")).and_then(Value::as_str).unwrap_or("default");
    let all_dim = num(params, "mscale_all_dim").unwrap_or(0.0);
    if rope_type == "default" || all_dim == 0.0 {
        return Ok(1.0);
    }
    let factor = num(params, "factor")
        .ok_or_else(|| Error::Config("rope parameters with mscale_all_dim need \"factor\"".into()))?;
    Ok(if factor <= 1.0 { 1.0 } else { 0.1 * all_dim * libm::log(factor) + 1.0 })
}

impl RopeConfig {
    /// Reads `rope_parameters` (v5), else `rope_theta` + `rope_scaling` (v4).
    pub fn from_config(cfg: &Value, head_dim: usize, max_positions: usize) -> Result<Self> {
        Self::from_config_with_partial(cfg, head_dim, max_positions, 1.0)
    }

    /// [`RopeConfig::from_config`] for a family whose `partial_rotary_factor` defaults to
    /// `default_partial` when the config does not give one.
    pub fn from_config_with_partial(
        cfg: &Value,
        head_dim: usize,
        max_positions: usize,
        default_partial: f64,
    ) -> Result<Self> {
        let empty = Value::Object(Default::default());
        let params = rope_params(cfg).unwrap_or(&empty);
        let theta = num(params, "rope_theta").or_else(|| num(cfg, "rope_theta")).unwrap_or(10000.0);
        let partial = num(params, "partial_rotary_factor")
            .or_else(|| num(cfg, "partial_rotary_factor"))
            .unwrap_or(default_partial);
        let rotary_dim = ((head_dim as f64) * partial) as usize;
        if rotary_dim == 0 || !rotary_dim.is_multiple_of(2) || rotary_dim > head_dim {
            return Err(Error::Config(format!("invalid rotary dimension {rotary_dim} for head_dim {head_dim}")));
        }
        let rope_type =
            params.get("rope_type").or_else(|| params.get("type")).and_then(Value::as_str).unwrap_or("default");
        let factor = num(params, "factor");
        let need_factor = || factor.ok_or_else(|| Error::Config(format!("rope type {rope_type:?} needs \"factor\"")));
        let original_max = num(params, "original_max_position_embeddings").map(|x| x as usize);
        let kind = match rope_type {
            "default" => RopeKind::Default,
            "linear" => RopeKind::Linear { factor: need_factor()? as f32 },
            "yarn" => {
                let original_max = original_max.unwrap_or(max_positions);
                let factor = match factor {
                    Some(f) => f,
                    None => max_positions as f64 / original_max as f64,
                };
                RopeKind::Yarn {
                    factor,
                    original_max,
                    beta_fast: num(params, "beta_fast").filter(|b| *b != 0.0).unwrap_or(32.0),
                    beta_slow: num(params, "beta_slow").filter(|b| *b != 0.0).unwrap_or(1.0),
                    attention_factor: num(params, "attention_factor"),
                    mscale: num(params, "mscale"),
                    mscale_all_dim: num(params, "mscale_all_dim"),
                    truncate: params.get("truncate").and_then(Value::as_bool).unwrap_or(true),
                }
            }
            "llama3" => RopeKind::Llama3 {
                factor: need_factor()? as f32,
                low_freq_factor: num(params, "low_freq_factor").unwrap_or(1.0) as f32,
                high_freq_factor: num(params, "high_freq_factor").unwrap_or(4.0) as f32,
                original_max: original_max.unwrap_or(8192),
            },
            other => {
                return Err(Error::Config(format!(
                    "rope type {other:?} is not supported (supported: default, linear, yarn, llama3)"
                )))
            }
        };
        Ok(RopeConfig { theta, rotary_dim, kind })
    }
}

/// Precomputed inverse frequencies; produces cos/sin for any position.
#[derive(Clone, Debug)]
pub struct Rope {
    pub rotary_dim: usize,
    /// (rotary_dim / 2) inverse frequencies, float32 as transformers keeps them.
    pub inv_freq: Vec<f32>,
    /// Multiplies cos and sin (yarn's attention factor; 1 otherwise).
    pub attention_factor: f32,
}

impl Rope {
    pub fn new(cfg: &RopeConfig) -> Self {
        let dim = cfg.rotary_dim;
        let half = dim / 2;
        // base ** (arange(0, dim, 2).float() / dim), in float32 like transformers.
        let pos_freqs: Vec<f32> = (0..half)
            .map(|i| {
                let e = (2 * i) as f32 / dim as f32;
                libm::pow(cfg.theta, e as f64) as f32
            })
            .collect();
        let mut attention_factor = 1.0f32;
        let inv_freq: Vec<f32> = match &cfg.kind {
            RopeKind::Default => pos_freqs.iter().map(|p| 1.0 / p).collect(),
            RopeKind::Linear { factor } => pos_freqs.iter().map(|p| (1.0 / p) / factor).collect(),
            RopeKind::Yarn {
                factor,
                original_max,
                beta_fast,
                beta_slow,
                attention_factor: af,
                mscale,
                mscale_all_dim,
                truncate,
            } => {
                let get_mscale = |scale: f64, m: f64| if scale <= 1.0 { 1.0 } else { 0.1 * m * libm::log(scale) + 1.0 };
                attention_factor = match (af, mscale, mscale_all_dim) {
                    (Some(a), _, _) => *a as f32,
                    (None, Some(m), Some(ma)) if *m != 0.0 && *ma != 0.0 => {
                        (get_mscale(*factor, *m) / get_mscale(*factor, *ma)) as f32
                    }
                    _ => get_mscale(*factor, 1.0) as f32,
                };
                let correction_dim = |rot: f64| {
                    (dim as f64 * libm::log(*original_max as f64 / (rot * 2.0 * std::f64::consts::PI)))
                        / (2.0 * libm::log(cfg.theta))
                };
                let (mut low, mut high) = (correction_dim(*beta_fast), correction_dim(*beta_slow));
                if *truncate {
                    low = libm::floor(low);
                    high = libm::ceil(high);
                }
                let low = low.max(0.0) as f32;
                let mut high = high.min(dim as f64 - 1.0) as f32;
                if low == high {
                    high += 0.001;
                }
                let f = *factor as f32;
                pos_freqs
                    .iter()
                    .enumerate()
                    .map(|(i, p)| {
                        let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                        let extrapolation_factor = 1.0 - ramp;
                        let extra = 1.0 / p;
                        let inter = 1.0 / (f * p);
                        inter * (1.0 - extrapolation_factor) + extra * extrapolation_factor
                    })
                    .collect()
            }
            RopeKind::Llama3 { factor, low_freq_factor, high_freq_factor, original_max } => {
                let old = *original_max as f32;
                let low_wavelen = old / low_freq_factor;
                let high_wavelen = old / high_freq_factor;
                pos_freqs
                    .iter()
                    .map(|p| {
                        let inv = 1.0 / p;
                        let wavelen = 2.0 * std::f32::consts::PI / inv;
                        let scaled = if wavelen > low_wavelen { inv / factor } else { inv };
                        if wavelen < high_wavelen || wavelen > low_wavelen {
                            scaled
                        } else {
                            let smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * scaled / factor + smooth * scaled
                        }
                    })
                    .collect()
            }
        };
        Rope { rotary_dim: dim, inv_freq, attention_factor }
    }

    /// cos and sin of each frequency at `pos` (rotary_dim / 2 values each).
    pub fn cos_sin(&self, pos: usize, cos: &mut Vec<f32>, sin: &mut Vec<f32>) {
        cos.clear();
        sin.clear();
        for &f in &self.inv_freq {
            // transformers: freqs = position (float32) * inv_freq, in float32.
            let angle = (pos as f32 * f) as f64;
            cos.push(libm::cos(angle) as f32 * self.attention_factor);
            sin.push(libm::sin(angle) as f32 * self.attention_factor);
        }
    }

    /// Rotate every head of `x` (heads of `head_dim` values laid end to end) in place,
    /// in the "rotate_half" layout: pairs (i, i + rotary_dim/2). The interleaved layout
    /// (pairs (2i, 2i + 1)) is this after [`deinterleave`].
    pub fn apply(&self, x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
        let half = self.rotary_dim / 2;
        for head in x.chunks_exact_mut(head_dim) {
            for i in 0..half {
                let x1 = head[i];
                let x2 = head[i + half];
                // q * cos + rotate_half(q) * sin, rotate_half(q) = cat(-x2, x1)
                head[i] = x1 * cos[i] + (-x2) * sin[i];
                head[i + half] = x2 * cos[i] + x1 * sin[i];
            }
        }
    }
}

/// Reorders `x` from interleaved pairs (x0, x1, x2, x3, ...) to halves (x0, x2, ..., x1,
/// x3, ...), so that [`Rope::apply`] rotates the pairs DeepSeek rotates. transformers'
/// `apply_rotary_pos_emb_interleave` returns its result in this order too, for q and k
/// alike, so every dot product between them is unchanged.
pub fn deinterleave(x: &mut [f32], scratch: &mut Vec<f32>) {
    scratch.clear();
    scratch.extend(x.iter().step_by(2));
    scratch.extend(x.iter().skip(1).step_by(2));
    x.copy_from_slice(scratch);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rope(v: Value, head_dim: usize) -> Rope {
        Rope::new(&RopeConfig::from_config(&v, head_dim, 4096).unwrap())
    }

    #[test]
    fn default_frequencies_and_rotation() {
        let r = rope(json!({"rope_theta": 10000.0}), 8);
        assert_eq!(r.inv_freq.len(), 4);
        assert_eq!(r.inv_freq[0], 1.0);
        assert!((r.inv_freq[1] as f64 - 0.1).abs() < 1e-8);
        // Position 0 is the identity.
        let (mut c, mut s) = (vec![], vec![]);
        r.cos_sin(0, &mut c, &mut s);
        let mut x: Vec<f32> = (0..16).map(|i| i as f32 * 0.5 - 3.0).collect();
        let orig = x.clone();
        r.apply(&mut x, 8, &c, &s);
        assert_eq!(x, orig);
        // A rotation preserves each pair's norm and matches the complex-number form.
        r.cos_sin(7, &mut c, &mut s);
        r.apply(&mut x, 8, &c, &s);
        for h in 0..2 {
            for i in 0..4 {
                let (a, b) = (orig[h * 8 + i] as f64, orig[h * 8 + i + 4] as f64);
                let th = 7.0 * r.inv_freq[i] as f64;
                let (wa, wb) = (a * th.cos() - b * th.sin(), b * th.cos() + a * th.sin());
                assert!((x[h * 8 + i] as f64 - wa).abs() < 1e-5);
                assert!((x[h * 8 + i + 4] as f64 - wb).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn v4_and_v5_spellings_agree() {
        let a = rope(json!({"rope_theta": 500.0, "rope_scaling": {"type": "linear", "factor": 2.0}}), 16);
        let b = rope(json!({"rope_parameters": {"rope_type": "linear", "rope_theta": 500.0, "factor": 2.0}}), 16);
        assert_eq!(a.inv_freq, b.inv_freq);
        let d = rope(json!({"rope_theta": 500.0}), 16);
        for (l, d) in a.inv_freq.iter().zip(&d.inv_freq) {
            assert_eq!(*l, d / 2.0);
        }
    }

    #[test]
    fn yarn_matches_a_hand_computation() {
        // transformers' _compute_yarn_parameters for dim 16, base 10000, factor 4, original 32.
        let r = rope(
            json!({"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32}}),
            16,
        );
        let expected_af = 0.1 * 4.0f64.ln() + 1.0;
        assert!((r.attention_factor as f64 - expected_af).abs() < 1e-6);
        let dim = 16.0f64;
        let cd = |rot: f64| dim * (32.0 / (rot * 2.0 * std::f64::consts::PI)).ln() / (2.0 * 10000f64.ln());
        let low = cd(32.0).floor().max(0.0);
        let high = cd(1.0).ceil().min(15.0);
        for i in 0..8 {
            let p = 10000f64.powf(2.0 * i as f64 / dim);
            let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            let want = (1.0 / (4.0 * p)) * ramp + (1.0 / p) * (1.0 - ramp);
            assert!(((r.inv_freq[i] as f64) - want).abs() <= want * 1e-6, "{i}");
        }
    }

    #[test]
    fn partial_rotary_leaves_the_tail_alone() {
        let r = rope(json!({"partial_rotary_factor": 0.5}), 8);
        assert_eq!(r.rotary_dim, 4);
        let (mut c, mut s) = (vec![], vec![]);
        r.cos_sin(3, &mut c, &mut s);
        let mut x = vec![1.0f32; 8];
        r.apply(&mut x, 8, &c, &s);
        assert_eq!(&x[4..], &[1.0; 4]);
        assert_ne!(x[0], 1.0);
    }

    #[test]
    fn interleaved_pairs_rotate_together() {
        // After deinterleave, apply rotates (x0, x1) by the first frequency, (x2, x3) by
        // the second: transformers' apply_rotary_pos_emb_interleave.
        let r = rope(json!({}), 4);
        let (mut c, mut s) = (vec![], vec![]);
        r.cos_sin(5, &mut c, &mut s);
        let x = [1.0f32, 2.0, 3.0, 4.0];
        let mut y = x.to_vec();
        deinterleave(&mut y, &mut Vec::new());
        assert_eq!(y, [1.0, 3.0, 2.0, 4.0]);
        r.apply(&mut y, 4, &c, &s);
        for i in 0..2 {
            let (a, b) = (x[2 * i], x[2 * i + 1]);
            assert_eq!(y[i], a * c[i] - b * s[i]);
            assert_eq!(y[i + 2], b * c[i] + a * s[i]);
        }
    }

    #[test]
    fn deepseek_mscale() {
        let yarn = |m: f64| {
            json!({"rope_scaling": {"type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": m,
                "original_max_position_embeddings": 4096}})
        };
        let m = softmax_mscale(&yarn(1.0)).unwrap();
        assert_eq!(m, 0.1 * 40f64.ln() + 1.0);
        assert_eq!(softmax_mscale(&yarn(0.0)).unwrap(), 1.0);
        assert_eq!(softmax_mscale(&json!({"rope_theta": 10000.0})).unwrap(), 1.0);
        // DeepSeek-V3's own numbers: mscale == mscale_all_dim leaves cos/sin unscaled.
        let r = rope(yarn(1.0), 64);
        assert_eq!(r.attention_factor, 1.0);
    }

    #[test]
    fn unsupported_type_is_an_error() {
        let e = RopeConfig::from_config(&json!({"rope_scaling": {"type": "dynamic", "factor": 2.0}}), 8, 64);
        assert!(e.unwrap_err().to_string().contains("dynamic"));
    }
}
