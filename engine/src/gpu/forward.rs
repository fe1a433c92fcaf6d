//! Driving a forward pass of the GPU model over a session ([`GpuModel::forward`]): the
//! tokens a recurrent state still lacks fed again, the KV cache grown, the states made
//! ready, then the one graph ([`crate::model::graph`]) recorded by the GPU backend
//! ([`GpuPass`]). Apart from gpu/model.rs (the weights and sessions) so that the model does
//! not import the backend that imports it.

use std::borrow::Borrow;

use super::backend::GpuPass;
use super::deltanet::GpuDeltaState;
use super::model::{GpuModel, GpuSession};
use super::recorder::Recorder;
use super::weights::GpuAttn;
use crate::error::Result;
use crate::model::{Logits, Model};

impl<M: Borrow<Model>> GpuModel<M> {
    /// Feeds `ids` after what `session` holds and returns logits, (n, vocab) for
    /// `Logits::All` or (vocab) for `Logits::Last`, like `Model::forward`.
    pub async fn forward(&self, session: &mut GpuSession, ids: &[u32], which: Logits) -> Result<Vec<f32>> {
        self.forward_with(session, ids, which, &mut |_, _, _| {}).await
    }

    /// Native convenience: [`GpuModel::forward`] run to completion.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn forward_blocking(&self, session: &mut GpuSession, ids: &[u32], which: Logits) -> Result<Vec<f32>> {
        pollster::block_on(self.forward(session, ids, which))
    }

    /// [`GpuModel::forward`], reporting every routed expert use as (layer, expert, positions).
    pub async fn forward_with(
        &self,
        session: &mut GpuSession,
        ids: &[u32],
        which: Logits,
        on_use: &mut dyn FnMut(usize, usize, usize),
    ) -> Result<Vec<f32>> {
        let c = &self.m().cfg;
        session.verifying(crate::model::snapshots::decode_like(ids.len(), which));
        let held = session.cached_len();
        if held < session.tokens.len() {
            // A recurrent state went back further than the session's tokens: feed the
            // tokens in between again, with these, and return these ones' logits
            // (Model::forward_observed).
            c.check_input(ids, session.tokens.len())?;
            let again = session.tokens.len() - held;
            let all: Vec<u32> = session.tokens[held..].iter().chain(ids).copied().collect();
            session.tokens.truncate(held);
            return match self.forward_fed(session, &all, which, on_use).await {
                Ok(logits) if which == Logits::All => Ok(logits[again * c.vocab..].to_vec()),
                Ok(logits) => Ok(logits),
                Err(e) => {
                    session.truncate(held);
                    Err(e)
                }
            };
        }
        self.forward_fed(session, ids, which, on_use).await
    }

    /// [`GpuModel::forward_with`] on a session whose caches hold all its tokens: the
    /// graph ([`crate::model::graph`]) recorded by the GPU backend ([`GpuPass`]).
    pub(super) async fn forward_fed(
        &self,
        session: &mut GpuSession,
        ids: &[u32],
        which: Logits,
        on_use: &mut dyn FnMut(usize, usize, usize),
    ) -> Result<Vec<f32>> {
        let c = &self.m().cfg;
        let (n, pos0) = (ids.len(), session.tokens.len());
        c.check_input(ids, pos0)?;
        let mut rec = Recorder::new(&self.ctx);
        self.ensure_kv(&mut rec, session, pos0, pos0 + n)?;
        prepare_states(self, session, n)?;
        let v4 = self.v4.is_some();
        if v4 {
            prepare_v4(self, session, pos0, n)?;
        }
        let (logits, _) = {
            let mut pass = GpuPass::new(self, rec, session, n, on_use)?;
            crate::model::graph::forward(&mut pass, ids, which, false).await?
        };
        session.tokens.extend_from_slice(ids);
        if v4 {
            session.v4_pos = session.tokens.len();
        }
        Ok(logits)
    }
}

/// DeepSeek-V4's state for a pass of `n` positions from `pos0`: fresh layers for a pass
/// from the start, else snapshotted before a multi-token pass and the pass after one (as
/// the CPU's `V4State::begin`); until the pass succeeds the state counts as holding
/// nothing (a failed pass leaves it half-advanced: the next one restarts from the first
/// token, as on the CPU).
fn prepare_v4<M: Borrow<Model>>(gm: &GpuModel<M>, session: &mut GpuSession, pos0: usize, n: usize) -> Result<()> {
    let c = &gm.m().cfg;
    let v4 =
        c.v4.as_deref().ok_or_else(|| crate::error::Error::Gpu("DeepSeek-V4 weights without its config".into()))?;
    if pos0 == 0 || session.v4.len() != c.n_layers || session.v4_pos != pos0 {
        if pos0 != 0 {
            return Err(crate::error::Error::Gpu(format!(
                "DeepSeek-V4's state holds {} tokens, not the {pos0} before this pass",
                session.v4_pos
            )));
        }
        session.v4 = (0..c.n_layers)
            .map(|_| super::v4_attn::GpuV4Layer::new(&gm.ctx, v4.window, c.head_dim))
            .collect::<Result<_>>()?;
        session.v4_snapshots.clear();
    }
    if session.v4_snapshots.begin(n) && session.v4_snapshots.wants(pos0) {
        // Into the buffers of the snapshot it pushes out, if any.
        let mut old = session.v4_snapshots.make_room().unwrap_or_default().into_iter();
        let layers = session.v4.iter().map(|l| l.snapshot(&gm.ctx, old.next())).collect::<Result<_>>()?;
        session.v4_snapshots.push(pos0, layers);
    }
    session.v4_pos = 0;
    Ok(())
}

/// Makes a session ready for a pass of positions pos0..pos0 + n: recurrent states
/// created, and snapshotted before a multi-token pass (which may be rolled back to here)
/// and before the pass after one (where a prompt ended), as the CPU's `delta_begin` does.
pub(super) fn prepare_states<M: Borrow<Model>>(gm: &GpuModel<M>, session: &mut GpuSession, n: usize) -> Result<()> {
    let ctx = &*gm.ctx;
    if session.recurrent.len() != gm.layers.len() {
        session.recurrent = gm
            .layers
            .iter()
            .map(|lw| match &lw.attn {
                GpuAttn::Linear(d) => GpuDeltaState::new(ctx, &d.cfg).map(Some),
                _ => Ok(None),
            })
            .collect::<Result<_>>()?;
    }
    for st in session.recurrent.iter_mut().flatten() {
        if st.begin(n) {
            st.snapshot(ctx)?;
        }
    }
    Ok(())
}
