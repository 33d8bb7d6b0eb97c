"""Reports: presets, the notebook helpers, seaborn plots, the papermill suite runner and the HTML index.

Modules are imported on use (papermill, nbconvert and seaborn are the `lab` extra):
`io` (atomic tables and headlines), `presets`, `parameters` (a notebook's Config, resolved once),
`notebook` (a notebook's derived cell, `setup`), `quiet` (known warnings counted, not shown),
`tables` (tables as a report shows them), `plots`, `html` (notebook to HTML, the index), `kernel`
(the notebooks' Jupyter kernel), `provenance` (which code produced a run), `runner` (`gdn-lab run`),
`strip` (clear outputs).
"""
