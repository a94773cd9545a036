//! The step's op list for the fusion pass (backend/cuda/fusion.rs), taken
//! from the model's own graph: the graph runs once over [`ShapeExec`], an
//! executor whose activations are names and lengths and whose ops are
//! recorded, not run. So the pass sees exactly the ops the step will issue
//! (no second description of the graph to keep in step with it).

use crate::backend::cuda::fusion::{
    plan, ActRead, BufId, JobDesc, MatOp, NormDesc, OpFusion, ParamId, StepFusion, StepOp,
};
use crate::backend::cuda::MatvecTuning;
use crate::backend::{KvInfo, Mem, Mode, OpT, WeightInfo};
use crate::dispatch::weights::Store;
use crate::dispatch::{Exec, HostLogits, StepBufs};
use crate::quant::GgmlType;
use anyhow::{bail, Result};
use std::cell::{Cell, RefCell};
use std::sync::Arc;

/// An activation of the recorded step: its name and length (f32 values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Named {
    pub id: BufId,
    pub len: usize,
}

/// A weight matrix's type and shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatShape {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
}

impl WeightInfo for MatShape {
    fn ty(&self) -> GgmlType {
        self.ty
    }
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn data_len(&self) -> usize {
        0
    }
}

/// The KV cache's geometry (block_size, n_kv_heads, head_dim), its cells
/// and layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvShape {
    pub geometry: (usize, usize, usize),
    pub cells: usize,
    pub layers: usize,
    /// Hybrid models: the recurrent state arrays' shape.
    pub states: Option<crate::kv::StateGeometry>,
}

impl KvInfo for KvShape {
    fn geometry(&self) -> (usize, usize, usize) {
        self.geometry
    }
    fn kv_type(&self) -> crate::backend::KvType {
        crate::backend::KvType::F16
    }
}

/// The memory space of a recorded step: names instead of buffers.
pub struct ShapeMem;

impl Mem for ShapeMem {
    type In<'a> = Named;
    type Out<'a> = Named;
    type Idx<'a> = usize;
    type Param<'a> = ParamId;
    type W<'a> = MatShape;
    type Kv<'a> = KvShape;
    type KvMut<'a> = KvShape;
    type Batch<'a> = ();
}

/// What a matmul of `n` rows of `k` values by weights of `ty` with job
/// rows `rows` reads (the matmul planner's answer).
pub type ReadsFn<'r> = dyn Fn(usize, GgmlType, usize, &[usize]) -> ActRead + 'r;

/// Records a step's ops over weights in store `S` (`shape` reads a
/// matrix's type and shape).
pub struct ShapeExec<'r, S: Store> {
    shape: fn(&S::Mat) -> MatShape,
    reads: &'r ReadsFn<'r>,
    next: Cell<BufId>,
    ops: RefCell<Vec<StepOp>>,
    /// Each op's kind and, for a matmul, its rows: what the executor
    /// checks the issued ops against.
    kinds: RefCell<Vec<OpKey>>,
}

/// An op's kind and, for a matmul, its rows.
pub type OpKey = (&'static str, Option<usize>);

fn op_key<M: Mem>(op: &OpT<'_, M>) -> OpKey {
    let rows = match op {
        OpT::MatMul { n, .. } | OpT::MatMuls { n, .. } => Some(*n),
        _ => None,
    };
    (op.kind(), rows)
}

/// A step's ops as recorded and the fusion pass's annotations of them.
#[derive(Debug)]
pub struct Planned {
    keys: Vec<OpKey>,
    fusion: StepFusion,
}

impl Planned {
    /// The pass over the recorded `ops` in `mode` under `t`.
    pub fn new(ops: Vec<StepOp>, keys: Vec<OpKey>, mode: Mode, t: &MatvecTuning) -> Planned {
        Planned {
            fusion: plan(&ops, mode, t),
            keys,
        }
    }
}

/// Where the executor is in a planned step: the annotation of each op
/// as it is issued, in order.
#[derive(Default)]
pub struct Cursor {
    planned: Option<Arc<Planned>>,
    next: usize,
}

impl Cursor {
    /// A step starts (None: an unplanned one, whose ops get no annotation).
    pub fn start(&mut self, planned: Option<Arc<Planned>>) {
        self.planned = planned;
        self.next = 0;
    }

    /// The annotation of the op `op` issued next: None outside a planned
    /// step, or where the op is not the one recorded there (then the rest
    /// of the step runs without annotations: the backend's rules, the
    /// same bits as before the pass).
    pub fn take<M: Mem>(&mut self, op: &OpT<'_, M>) -> Option<OpFusion> {
        self.take_key(op_key(op))
    }

    /// `take` by the op's key.
    pub fn take_key(&mut self, key: OpKey) -> Option<OpFusion> {
        let p = self.planned.as_ref()?;
        let i = self.next;
        self.next += 1;
        if p.keys.get(i) == Some(&key) {
            return p.fusion.ops.get(i).copied();
        }
        tracing::debug!(
            "fusion: op {i} ({key:?}) is not the planned {:?}; the step runs on unannotated",
            p.keys.get(i)
        );
        self.planned = None;
        None
    }
}

impl<'r, S: Store> ShapeExec<'r, S> {
    pub fn new(shape: fn(&S::Mat) -> MatShape, reads: &'r ReadsFn<'r>) -> Self {
        ShapeExec {
            shape,
            reads,
            next: Cell::new(0),
            ops: RefCell::new(Vec::new()),
            kinds: RefCell::new(Vec::new()),
        }
    }

    /// The ops recorded so far.
    pub fn into_ops(self) -> Vec<StepOp> {
        self.ops.into_inner()
    }

    /// The ops recorded so far and their keys.
    pub fn into_parts(self) -> (Vec<StepOp>, Vec<OpKey>) {
        (self.ops.into_inner(), self.kinds.into_inner())
    }

    /// A step's index inputs for `n` rows, `n_rows` of them wanting logits
    /// (or their hidden states: `hidden`).
    pub fn step_bufs(n: usize, n_rows: usize, rows_all: bool, hidden: bool) -> StepBufs<usize, ()> {
        StepBufs {
            n,
            n_rows,
            tokens: n,
            positions: n,
            slots: n,
            state_slots: n,
            rows: n_rows,
            rows_all,
            hidden,
            batch: (),
        }
    }

    fn step_op(&self, op: OpT<'_, ShapeMem>) -> Result<StepOp> {
        Ok(match op {
            OpT::MatMul { w, x, n, out } => {
                let job = JobDesc {
                    m: w.rows,
                    add: false,
                    out: out.id,
                };
                self.mat_op(x, n, &[w], vec![job], None, None, None)
            }
            OpT::MatMuls {
                x,
                n,
                jobs,
                norm,
                next_norm,
                glu,
            } => {
                let ws: Vec<MatShape> = jobs.iter().map(|j| j.w).collect();
                let descs = jobs
                    .iter()
                    .map(|j| JobDesc {
                        m: j.w.rows,
                        add: j.add,
                        out: j.out.id,
                    })
                    .collect();
                let norm = norm.map(|nm| NormDesc {
                    w: nm.w,
                    eps: nm.eps.to_bits(),
                    scratch: nm.out.id,
                });
                let next_norm = next_norm.map(|(p, eps)| (p, eps.to_bits()));
                self.mat_op(x, n, &ws, descs, norm, next_norm, glu.map(|g| g.id))
            }
            OpT::RmsNorm { dim, out, .. } => {
                if dim == 0 {
                    bail!("step ops: an rms_norm of rows of 0 values");
                }
                StepOp::RmsNorm {
                    out: out.id,
                    n: out.len / dim,
                    dim,
                }
            }
            OpT::SwiGlu { out, .. } => StepOp::SwiGlu {
                out: out.id,
                len: out.len,
            },
            OpT::PagedAttention {
                n_heads,
                cache,
                out,
                ..
            } => {
                let width = n_heads * cache.geometry().2;
                if width == 0 {
                    bail!("step ops: an attention of rows of 0 values");
                }
                StepOp::PagedAttention {
                    out: out.id,
                    n: out.len / width,
                    width,
                }
            }
            OpT::Rope { .. } => StepOp::Other { kind: "rope" },
            OpT::RopeKvWrite { .. } => StepOp::Other {
                kind: "rope_kv_write",
            },
            OpT::GetRows { .. } => StepOp::Other { kind: "get_rows" },
            OpT::SelectRows { .. } => StepOp::Other {
                kind: "select_rows",
            },
            OpT::Add { .. } => StepOp::Other { kind: "add" },
            OpT::AddBias { .. } => StepOp::Other { kind: "add_bias" },
            OpT::KvWrite { .. } => StepOp::Other { kind: "kv_write" },
            op @ (OpT::Conv1dSilu { .. }
            | OpT::L2NormHeads { .. }
            | OpT::GdnGates { .. }
            | OpT::DeltaRule { .. }
            | OpT::GatedRmsNorm { .. }
            | OpT::SplitHeads { .. }
            | OpT::SigmoidMul { .. }
            | OpT::AllGather { .. }
            | OpT::AllReduce { .. }) => StepOp::Other { kind: op.kind() },
        })
    }

    #[allow(clippy::too_many_arguments)] // the op's fields
    fn mat_op(
        &self,
        x: Named,
        n: usize,
        ws: &[MatShape],
        jobs: Vec<JobDesc>,
        norm: Option<NormDesc>,
        next_norm: Option<(ParamId, u32)>,
        glu: Option<BufId>,
    ) -> StepOp {
        let (ty, k) = ws.first().map_or((GgmlType::F32, 0), |w| (w.ty, w.cols));
        let rows: Vec<usize> = ws.iter().map(|w| w.rows).collect();
        StepOp::MatMuls(MatOp {
            x: x.id,
            n,
            k,
            ty,
            jobs,
            norm,
            next_norm,
            glu,
            reads: (self.reads)(n, ty, k, &rows),
        })
    }
}

impl<S: Store> Exec for ShapeExec<'_, S> {
    type M = ShapeMem;
    type S = S;
    type Buf = Named;
    type IdxBuf<'i> = usize;
    type BatchBuf<'i> = ();
    type Kv = KvShape;

    fn zeros(&self, len: usize) -> Result<Named> {
        let id = self.next.get();
        self.next.set(id + 1);
        Ok(Named { id, len })
    }
    fn rd(b: &Named) -> Named {
        *b
    }
    fn wr(b: &mut Named) -> Named {
        *b
    }
    fn mat<'a>(&'a self, m: &'a S::Mat) -> Result<MatShape> {
        Ok((self.shape)(m))
    }
    fn param(v: &S::Vec) -> ParamId {
        // The parameter's identity for this recording: its host object,
        // which outlives the step (the model's weights).
        v as *const S::Vec as usize
    }
    fn idx(&self, v: &[u32]) -> Result<usize> {
        Ok(v.len())
    }
    fn idx_view(b: &usize) -> usize {
        *b
    }
    fn batch<'i>(&self, _kv: &KvShape, _b: crate::backend::AttnBatch<'i>) -> Result<()> {
        Ok(())
    }
    fn batch_view(_b: &()) {}
    fn kv_cells(kv: &KvShape) -> usize {
        kv.cells
    }
    fn kv_layer(kv: &KvShape, li: usize) -> Result<KvShape> {
        if li >= kv.layers {
            bail!("KV layer {li} out of range ({} layers)", kv.layers);
        }
        Ok(*kv)
    }
    fn kv_layer_mut(kv: &mut KvShape, li: usize) -> Result<KvShape> {
        Self::kv_layer(kv, li)
    }
    fn state_layer_mut(kv: &mut KvShape, i: usize) -> Result<(Named, Named)> {
        let Some(g) = kv.states else {
            bail!("this KV cache holds no recurrent state");
        };
        if i >= g.n_layers {
            bail!("recurrent layer {i} out of range ({} layers)", g.n_layers);
        }
        // Names from the top of the id space: the state arrays outlive
        // the step, so they never collide with its activations.
        Ok((
            Named {
                id: BufId::MAX - 2 * i as BufId,
                len: g.conv_len * g.n_slots,
            },
            Named {
                id: BufId::MAX - 2 * i as BufId - 1,
                len: g.ssm_len * g.n_slots,
            },
        ))
    }
    fn reset_states(&self, _kv: &mut KvShape, _slots: &[u32]) -> Result<()> {
        Ok(())
    }
    fn run(&self, op: OpT<'_, ShapeMem>) -> Result<()> {
        let key = op_key(&op);
        let op = self.step_op(op)?;
        self.ops.borrow_mut().push(op);
        self.kinds.borrow_mut().push(key);
        Ok(())
    }
    fn download(&self, _b: Named) -> Result<HostLogits> {
        Ok(HostLogits::default())
    }
}

#[cfg(test)]
#[path = "step_ops_tests.rs"]
mod tests;
