# coec: structured pruning + compensation, every paper artifact a target.
#   snakemake --cores all results/table1.csv                      (embedded default, CPU)
#   snakemake results/table1.csv --workflow-profile workflow/profiles/slurm \
#             --configfile workflow/configs/paper.yaml
# (targets before --configfile: that option takes several files)

import os

from snakemake.utils import min_version

min_version("9.0")


configfile: os.path.join(workflow.basedir, "config.yaml")


# `snakemake --report report.html <targets>`: every table and figure, with captions (docs/report.md)
report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/prepare.smk"
include: "workflow/rules/calibrate.smk"
include: "workflow/rules/select.smk"
include: "workflow/rules/search.smk"
include: "workflow/rules/compensate.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/appc.smk"
include: "workflow/rules/export.smk"
include: "workflow/rules/iterative.smk"
include: "workflow/rules/deploy.smk"
include: "workflow/rules/frontier.smk"


rule all:
    default_target: True
    input:
        "results/table1.csv",
