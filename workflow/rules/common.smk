# The config, validated and filled from the schema (the one home of every default), and what the
# rules wire: coec.wiring (models, data, params, resources), coec.paths (the path scheme),
# coec.targets (each table's and figure's result files and spec). Rules only name these.
import json
import re

from coec import paths, targets
from coec.config import SCHEMA, one_line_errors, validate_config
from coec.wiring import Wiring, coec_command

# a bad config stops here with its one line (no traceback) and exit status 1
with one_line_errors():
    validate_config(config, SCHEMA)  # the schema is package data of coec (src/coec/schemas/); loads plugins
    # Fig. 2 calibration sets: the base set with nsamples replaced
    targets.add_fig2_calibrations(config)
    W = Wiring(config)
PY = coec_command(workflow.deployment_settings.deployment_method)
# envs/coec.post-deploy.sh installs this repository into a fresh --sdm conda environment
os.environ.update(COEC_SOURCE=workflow.basedir)  # set for the post-deploy script, not read here

# wildcard placeholders of the path scheme
CELL = paths.cell_dir("{model}", "{calib}", "{select}", "{ratio}", "{comp}")
SELECTION = paths.selection_dir("{model}", "{calib}", "{select}", "{ratio}")
CELL_LOG = "{model}/{calib}/{select}-{ratio}/{comp}"


wildcard_constraints:
    model=r"[^/]+",
    calib=r"[^/]+",
    select="|".join(re.escape(n) for n in sorted(W.selections, key=len, reverse=True)),
    ratio=r"0\.[0-9]+",
    comp=r"[^/]+",
    first=r"[0-9]+",
    last=r"[0-9]+",
