//! Programmatic dependent launch (PDL) in captured decode graphs.
//!
//! A stream capture links consecutive kernels by full dependencies: the
//! next kernel's CTAs are scheduled only after the previous grid has
//! drained, which costs a few microseconds per kernel, and a decode step of
//! a small model is hundreds of short kernels. On sm_90+ this module turns
//! the kernel-to-kernel edges of a captured graph into programmatic edges
//! (the graph form of `cudaLaunchAttributeProgrammaticStreamSerialization`):
//! the next kernel's CTAs may start once every CTA of the previous one has
//! executed `griddepcontrol.launch_dependents`, and each kernel's first
//! statement (`GRID_DEP()` in `kernels/common.cuh`: `griddepcontrol.wait`,
//! then the trigger) blocks until the previous grid has completed and its
//! writes are visible. Since every kernel waits before it reads or writes
//! anything, kernel k + 1 runs after kernel k has finished, hence after
//! every earlier node: the same order, the same bits.
//!
//! Only edges between two kernels of this backend change (foreign kernels,
//! cuBLAS's, would not wait); memcpy and memset nodes keep full edges.
//! Tuning `runtime.pdl = false` turns it off.

use crate::backend::cuda::CudaBackend;
use anyhow::{anyhow, Result};
use cudarc::driver::sys;
use std::collections::{BTreeMap, HashMap};

/// An instantiated graph with programmatic edges; destroyed on drop.
pub struct PdlExec(sys::CUgraphExec);

// SAFETY: graph execs are not tied to a thread; the owner serializes their
// use (launch, drop) and binds the context first.
unsafe impl Send for PdlExec {}

impl Drop for PdlExec {
    fn drop(&mut self) {
        // SAFETY: the exec was instantiated by `instantiate_pdl` and is
        // destroyed once; an error here cannot be acted on.
        let _ = unsafe { cudarc::driver::result::graph::exec_destroy(self.0) };
    }
}

/// The compute capability's major number of an `sm_XY` / `sm_XYZ` name
/// (the last digit is the minor); 0 for anything else.
pub(crate) fn arch_major(arch: &str) -> u32 {
    arch.strip_prefix("sm_")
        .and_then(|s| s.get(..s.len().saturating_sub(1)))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn cu(r: sys::CUresult, what: &str) -> Result<()> {
    r.result()
        .map_err(|e| anyhow!("CUDA driver error: {what}: {e:?}"))
}

/// A node's type.
fn node_type(node: sys::CUgraphNode) -> Result<sys::CUgraphNodeType> {
    let mut ty = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
    // SAFETY: node comes from a live graph's node or edge list.
    cu(
        unsafe { sys::cuGraphNodeGetType(node, &mut ty) },
        "graph node type",
    )?;
    Ok(ty)
}

/// The function of a kernel node (`ty`, its type), None for other nodes.
fn kernel_func(
    node: sys::CUgraphNode,
    ty: sys::CUgraphNodeType,
) -> Result<Option<sys::CUfunction>> {
    if ty != sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL {
        return Ok(None);
    }
    let mut p = std::mem::MaybeUninit::<sys::CUDA_KERNEL_NODE_PARAMS>::zeroed();
    // SAFETY: a kernel node; p receives its parameters (the pointers
    // inside stay owned by the graph and are not used).
    cu(
        unsafe { sys::cuGraphKernelNodeGetParams_v2(node, p.as_mut_ptr()) },
        "kernel node parameters",
    )?;
    // SAFETY: written by the successful call above.
    Ok(Some(unsafe { p.assume_init() }.func))
}

/// A node's name in the debug listing: its kernel's (`names`, by function
/// handle), or its node type.
fn node_label(node: sys::CUgraphNode, names: &HashMap<usize, &str>) -> Result<String> {
    let ty = node_type(node)?;
    Ok(match kernel_func(node, ty)? {
        Some(f) => names
            .get(&(f as usize))
            .map_or("(foreign kernel)".to_string(), |n| n.to_string()),
        None => format!("{ty:?}")
            .trim_start_matches("CU_GRAPH_NODE_TYPE_")
            .to_lowercase(),
    })
}

/// What a captured step holds, for the debug log: its nodes counted by
/// label, and the `full` edges (left without programmatic launch) counted
/// by (from, to) label.
#[allow(clippy::type_complexity)]
fn graph_listing(
    graph: sys::CUgraph,
    names: &HashMap<usize, &str>,
    full: &[(sys::CUgraphNode, sys::CUgraphNode)],
) -> Result<(BTreeMap<String, usize>, BTreeMap<(String, String), usize>)> {
    let mut count = 0usize;
    // SAFETY: size query with a null array.
    cu(
        unsafe { sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut count) },
        "counting graph nodes",
    )?;
    let mut nodes = vec![std::ptr::null_mut(); count];
    // SAFETY: the array holds `count` entries; count is updated to the
    // number written.
    cu(
        unsafe { sys::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut count) },
        "reading graph nodes",
    )?;
    let mut by_label = BTreeMap::new();
    for &node in nodes.iter().take(count) {
        *by_label.entry(node_label(node, names)?).or_default() += 1;
    }
    let mut edges = BTreeMap::new();
    for &(a, b) in full {
        *edges
            .entry((node_label(a, names)?, node_label(b, names)?))
            .or_default() += 1;
    }
    Ok((by_label, edges))
}

impl CudaBackend {
    /// Whether decode graphs get programmatic edges: compute capability 9.0
    /// or newer (the kernels' `griddepcontrol` is compiled in only there)
    /// and the tuning table's `runtime.pdl` is on.
    pub(crate) fn pdl_enabled(&self) -> bool {
        arch_major(&self.arch) >= 9 && self.tuning.runtime.pdl
    }

    /// Makes every edge of `graph` from one of this backend's kernels to
    /// another programmatic, then instantiates it. Returns the exec and the
    /// number of edges changed. `graph` stays owned by the caller.
    pub(crate) fn instantiate_pdl(&self, graph: sys::CUgraph) -> Result<(PdlExec, usize)> {
        // This backend's kernels by function handle (their names label the
        // debug listing).
        let ours: HashMap<usize, &str> = self
            .dev
            .funcs
            .iter()
            .map(|(n, f)| (f.cu_function() as usize, *n))
            .collect();
        let mut n: usize = 0;
        // SAFETY: size query with null arrays, as the driver API allows.
        cu(
            unsafe {
                sys::cuGraphGetEdges_v2(
                    graph,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    &mut n,
                )
            },
            "counting graph edges",
        )?;
        let mut from = vec![std::ptr::null_mut(); n];
        let mut to = vec![std::ptr::null_mut(); n];
        let mut data = vec![
            sys::CUgraphEdgeData {
                from_port: 0,
                to_port: 0,
                type_: 0,
                reserved: [0; 5],
            };
            n
        ];
        // SAFETY: the three arrays hold n entries each; n is updated to
        // the number written (the graph did not change since the count).
        cu(
            unsafe {
                sys::cuGraphGetEdges_v2(
                    graph,
                    from.as_mut_ptr(),
                    to.as_mut_ptr(),
                    data.as_mut_ptr(),
                    &mut n,
                )
            },
            "reading graph edges",
        )?;
        let is_ours = |node: sys::CUgraphNode| -> Result<bool> {
            Ok(kernel_func(node, node_type(node)?)?
                .is_some_and(|f| ours.contains_key(&(f as usize))))
        };
        let mut changed = 0;
        // Edges left full: each is a drain of the whole GPU between two
        // nodes (listed with RUST_LOG=quire=debug).
        let mut full = Vec::new();
        for i in 0..n.min(from.len()) {
            let d = data[i];
            if d.type_ != sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_DEFAULT as u8 {
                continue;
            }
            if !(is_ours(from[i])? && is_ours(to[i])?) {
                full.push((from[i], to[i]));
                continue;
            }
            let pdl = sys::CUgraphEdgeData {
                from_port: sys::CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC as u8,
                to_port: 0,
                type_: sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8,
                reserved: [0; 5],
            };
            // SAFETY: one existing edge removed (with its own edge data)
            // and the same pair linked again, programmatically.
            cu(
                unsafe { sys::cuGraphRemoveDependencies_v2(graph, &from[i], &to[i], &d, 1) },
                "removing a graph edge",
            )?;
            // SAFETY: both nodes belong to graph; one edge, its data above.
            cu(
                unsafe { sys::cuGraphAddDependencies_v2(graph, &from[i], &to[i], &pdl, 1) },
                "adding a programmatic graph edge",
            )?;
            changed += 1;
        }
        if tracing::enabled!(tracing::Level::DEBUG) {
            // A listing only: a failure to read it fails nothing else.
            match graph_listing(graph, &ours, &full) {
                Ok((nodes, edges)) => {
                    tracing::debug!("graph nodes: {nodes:?}");
                    tracing::debug!("graph edges left full (from, to): {edges:?}");
                }
                Err(e) => tracing::debug!("graph listing: {e:#}"),
            }
        }
        let mut exec = std::ptr::null_mut();
        // SAFETY: graph is a valid, complete graph; exec receives the
        // instantiated handle, owned by the returned PdlExec.
        cu(
            unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) },
            "instantiating a graph with programmatic edges",
        )?;
        Ok((PdlExec(exec), changed))
    }

    /// Launches a PDL graph on the backend's stream.
    pub(crate) fn launch_pdl(&self, exec: &PdlExec) -> Result<()> {
        self.bind()?;
        // SAFETY: exec is a live instantiated graph of this context; the
        // stream is the backend's.
        cu(
            unsafe { sys::cuGraphLaunch(exec.0, self.dev.stream.cu_stream()) },
            "launching a decode graph",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::arch_major;

    #[test]
    fn compute_capability_major() {
        assert_eq!(arch_major("sm_80"), 8);
        assert_eq!(arch_major("sm_89"), 8);
        assert_eq!(arch_major("sm_90"), 9);
        assert_eq!(arch_major("sm_100"), 10);
        assert_eq!(arch_major("sm_120"), 12);
        assert_eq!(arch_major("compute_90"), 0);
        assert_eq!(arch_major("sm_"), 0);
    }
}
