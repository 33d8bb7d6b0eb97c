"""Reports: presets, the notebook helpers, seaborn plots, the papermill suite runner and the HTML index.

Modules are imported on use (papermill, nbconvert and seaborn are the `lab` extra):
`io` (atomic tables and headlines), `presets`, `notebook` (a notebook's derived cell), `plots`,
`html` (notebook to HTML, the index), `runner` (`gdn-lab run`), `strip` (clear outputs).
"""
