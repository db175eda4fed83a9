# The config, validated and filled from the schema (the one home of every default), then read only
# through W (coec.workflow.wiring: models, data, params, resources; W.config, the planned config, for
# each table's and figure's inputs and spec in coec.workflow.targets) and coec.io.paths (the path
# scheme). Rules only name these; the config is never changed.
import json

from coec.io import paths
from coec.workflow import targets
from coec.config.validate import SCHEMA, one_line_errors, validate_config
from coec.workflow.wiring import Wiring, coec_command

# a bad config stops here with its one line (no traceback) and exit status 1
with one_line_errors():
    validate_config(config, SCHEMA)  # the schema is package data of coec (src/coec/config/schemas/); loads plugins
    W = Wiring(config)  # holds the planned config: the resized calibration sets of the figures added
PY = coec_command(workflow.deployment_settings.deployment_method)
# envs/coec.post-deploy.sh installs this repository into a fresh --sdm conda environment
os.environ.update(COEC_SOURCE=workflow.basedir)  # set for the post-deploy script, not read here

# wildcard placeholders of the path scheme
CELL = paths.cell_dir("{model}", "{calib}", "{select}", "{ratio}", "{comp}")
SELECTION = paths.selection_dir("{model}", "{calib}", "{select}", "{ratio}")
CELL_LOG = "{model}/{calib}/{select}-{ratio}/{comp}"


wildcard_constraints:
    **W.wildcard_constraints(),


def report_output(path, caption, category, subcategory=None, labels=None):
    """A table's or figure's output in the Snakemake report: its caption (workflow/report/<caption>),
    category, subcategory and label (its title, targets.report_label, unless given)."""
    return report(path, caption=f"../report/{caption}", category=category, subcategory=subcategory,
                  labels=labels or (lambda wc: targets.report_label(W.config, path.format(**dict(wc.items())))))
