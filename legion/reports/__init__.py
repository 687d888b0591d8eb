"""Read models of a run for the operator: node rows and the tree, per-node summary and timing, costs, the live
tree's state. Read-only; imported by `legion.cli`, never the other way round."""
