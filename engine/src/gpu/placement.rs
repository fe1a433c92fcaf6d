//! Where a GPU model's routed experts run (issue #16's hybrid placement): the mode
//! ([`Hybrid`]), what was measured ([`HybridStats`]), where each expert ran
//! ([`ExpertPlacement`]) and the placement state with its cost model ([`Placement`]). The
//! placement itself, and the CPU experts it starts, are in [`super::hybrid`].

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Mutex;

use crate::error::{Error, Result};

/// Where routed experts missing from the GPU pool are computed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Hybrid {
    /// Every routed expert on the GPU (missing ones are uploaded).
    #[default]
    Off,
    /// Missing experts held locally (RAM, or the browser's disk tier) run on the CPU once
    /// the pool is full.
    On,
    /// As `On`, but how many go to the CPU is chosen by measured cost (module docs).
    Auto,
}

impl FromStr for Hybrid {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "off" => Ok(Hybrid::Off),
            "on" => Ok(Hybrid::On),
            "auto" => Ok(Hybrid::Auto),
            _ => Err(Error::Invalid(format!("hybrid: expected off, on or auto, got {s:?}"))),
        }
    }
}

impl Hybrid {
    pub fn name(self) -> &'static str {
        match self {
            Hybrid::Off => "off",
            Hybrid::On => "on",
            Hybrid::Auto => "auto",
        }
    }
}

/// Where the routed experts ran, and the measured costs `Auto` decides by.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HybridStats {
    /// Routed expert uses (one per expert per layer per forward pass) computed on the CPU.
    pub cpu_experts: u64,
    /// ... and on the GPU.
    pub gpu_experts: u64,
    /// MoE layer passes that ran experts on the CPU.
    pub hybrid_layers: u64,
    /// Running averages, milliseconds per expert (None until measured); `cpu_ms` is an
    /// expert at one position, `cpu_position_ms` each further position on the CPU.
    pub cpu_ms: Option<f64>,
    pub cpu_position_ms: Option<f64>,
    pub upload_ms: Option<f64>,
    pub gpu_ms: Option<f64>,
}

/// Where one routed expert ran since the last `GpuModel::take_placement`: its uses (one
/// per layer pass that routed to it) computed on the CPU and on the GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpertPlacement {
    pub layer: usize,
    pub expert: usize,
    pub cpu: u64,
    pub gpu: u64,
}

/// A running average (weight 1/4 for each new sample).
pub(super) fn ema(old: Option<f64>, sample: f64) -> Option<f64> {
    Some(old.map_or(sample, |o| 0.75 * o + 0.25 * sample))
}

/// The placement state of one GPU model.
#[derive(Default)]
pub(super) struct Placement {
    pub(super) mode: Hybrid,
    pub(super) clock: Option<fn() -> f64>,
    pub(super) stats: Mutex<HybridStats>,
    /// Uses on the CPU and on the GPU per (layer, expert) since the last take.
    pub(super) placed: Mutex<BTreeMap<(usize, usize), [u64; 2]>>,
}

impl Placement {
    pub(super) fn now(&self) -> Option<f64> {
        self.clock.map(|c| c())
    }

    pub(super) fn stats(&self) -> Result<std::sync::MutexGuard<'_, HybridStats>> {
        self.stats.lock().map_err(|_| Error::Gpu("hybrid stats poisoned".into()))
    }

    /// How many of the CPU candidates run on the CPU, the first ones of `positions` (each
    /// candidate's positions, ascending); `gpu` experts run on the GPU anyway, `up` of
    /// them uploaded first.
    pub(super) fn cpu_share(&self, positions: &[usize], gpu: usize, up: usize) -> Result<usize> {
        let m = positions.len();
        if m == 0 || self.mode == Hybrid::Off {
            return Ok(0);
        }
        if self.mode == Hybrid::On || self.clock.is_none() {
            return Ok(m);
        }
        let s = *self.stats()?;
        let (Some(c), Some(g)) = (s.cpu_ms, s.gpu_ms) else { return Ok(1) };
        let (u, cp) = (s.upload_ms.unwrap_or(0.0), s.cpu_position_ms.unwrap_or(c));
        // CPU time of the first k candidates: an expert, plus each further position.
        let mut cpu = vec![0.0f64; m + 1];
        for (k, &p) in positions.iter().enumerate() {
            cpu[k + 1] = cpu[k] + c + p.saturating_sub(1) as f64 * cp;
        }
        let cost = |k: usize| {
            let gpu = (gpu + m - k) as f64 * g + (up + m - k) as f64 * u;
            cpu[k].max(gpu)
        };
        Ok((0..=m).min_by(|&a, &b| cost(a).total_cmp(&cost(b))).unwrap_or(0))
    }

    /// Records a CPU region's time: `ms` for `experts` experts at `positions` positions in
    /// all. A region of single-position experts (decode) measures the cost of an expert;
    /// one with more positions measures, from it, the cost of a further position (the
    /// first such region, before any single-position one, sets both to its time per
    /// position).
    pub(super) fn record_cpu(&self, ms: f64, experts: usize, positions: usize) -> Result<()> {
        if experts == 0 {
            return Ok(());
        }
        let mut st = self.stats()?;
        if positions <= experts {
            st.cpu_ms = ema(st.cpu_ms, ms / experts as f64);
        } else if let Some(c) = st.cpu_ms {
            let extra = (ms - experts as f64 * c).max(0.0) / (positions - experts) as f64;
            st.cpu_position_ms = ema(st.cpu_position_ms, extra);
        } else {
            st.cpu_ms = Some(ms / positions as f64);
            st.cpu_position_ms = st.cpu_ms;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auto(cpu: f64, per_position: Option<f64>, gpu: f64, upload: f64) -> Placement {
        let p = Placement { mode: Hybrid::Auto, clock: Some(|| 0.0), ..Default::default() };
        {
            let mut st = p.stats.lock().unwrap();
            (st.cpu_ms, st.cpu_position_ms, st.gpu_ms, st.upload_ms) =
                (Some(cpu), per_position, Some(gpu), Some(upload));
        }
        p
    }

    #[test]
    fn auto_weighs_each_candidates_positions() {
        // An expert costs 1 ms on the CPU at one position, 2 ms on the GPU (plus 1 ms of
        // upload): of four single-position candidates of a decode step, three go to the
        // CPU (3 ms) while the GPU uploads and computes the fourth (3 ms).
        let p = auto(1.0, Some(1.0), 2.0, 1.0);
        assert_eq!(p.cpu_share(&[1, 1, 1, 1], 0, 0).unwrap(), 3);
        // At 40 positions each further position costs 1 ms more: the GPU keeps them (it
        // would take the four in 12 ms, one of them on the CPU alone takes 40).
        assert_eq!(p.cpu_share(&[40, 40, 40, 40], 0, 0).unwrap(), 0);
        // Mixed: the cheap ones first.
        assert_eq!(p.cpu_share(&[1, 1, 30, 30], 0, 0).unwrap(), 2);
        // On and Off do not weigh.
        let on = Placement { mode: Hybrid::On, ..auto(1.0, None, 2.0, 1.0) };
        assert_eq!(on.cpu_share(&[40, 40], 0, 0).unwrap(), 2);
        let off = Placement { mode: Hybrid::Off, ..auto(1.0, None, 2.0, 1.0) };
        assert_eq!(off.cpu_share(&[1], 0, 0).unwrap(), 0);
    }

    #[test]
    fn cpu_costs_split_into_an_expert_and_its_further_positions() {
        let p = Placement { mode: Hybrid::Auto, clock: Some(|| 0.0), ..Default::default() };
        // A prefill region first: 2 experts, 20 positions in 10 ms: 0.5 ms per position
        // for both costs until a decode region measures an expert.
        p.record_cpu(10.0, 2, 20).unwrap();
        let st = *p.stats().unwrap();
        assert_eq!((st.cpu_ms, st.cpu_position_ms), (Some(0.5), Some(0.5)));
        // Decode regions: 4 single-position experts in 8 ms.
        p.record_cpu(8.0, 4, 4).unwrap();
        assert_eq!(p.stats().unwrap().cpu_ms, Some(0.875));
        // A prefill region then measures the further positions beyond that.
        p.record_cpu(2.0 * 0.875 + 18.0 * 0.25, 2, 20).unwrap();
        let per_position = p.stats().unwrap().cpu_position_ms.unwrap();
        assert!((per_position - (0.75 * 0.5 + 0.25 * 0.25)).abs() < 1e-12, "{per_position}");
    }
}
