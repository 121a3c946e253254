"""Offline allocation: which pod gets which device, before any node exists (`eks-dra plan`).

Files: claims.py reads manifests, simulate.py builds nodes from the shared device model, cel_env.py is the
selector CEL environment, allocator.py the per-node structured-parameters search, plan.py the
node-by-node scheduling loop, diagnose.py the failure reasons, report.py the table and JSON.

Where the plan can differ from kube-scheduler 1.34 (choices made on purpose, see the modules):
- Nodes are tried in a stable order and the first feasible one wins; kube-scheduler scores the feasible
  nodes. Which claims can be allocated agrees; which node or device a claim gets may differ.
- Pools are walked in (driver, pool) order; kube-scheduler walks them in map order.
- An allocator error (CEL evaluation error, a claim over 32 devices, `All` breaking a constraint) stops the
  pod; it is checked on the node tried and on an empty node of every other candidate layout.
- CEL: expressions are not type-checked at compile time (a type error shows at evaluation), there is no cost
  limit, and a domain reached only through a computed key (not a string literal) is an error rather than an
  empty map. `cel.bind` is rewritten into an equivalent comprehension.
- Not modelled: consumable capacity and partitionable devices (alpha in
  1.34), claims already allocated in the input (`status.allocation`), pod priority and preemption.
"""
