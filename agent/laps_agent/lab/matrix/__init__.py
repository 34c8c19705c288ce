"""A workload matrix: systems run over cells = workloads (arrival processes x length mixes, and
named workloads) x profiles x cluster shapes x loads, from one YAML file (spec.py), and the
report that compares every system with the first in every cell (report.py). `laps sim --matrix`
runs one (laps_agent.lab.sim.matrix); a cell is a pure definition (spec.cell_setup), so any driver
can run the same cells."""
