"""What the table, figure and report rules wire (``workflow/rules/report.smk``, ``appc.smk``,
``iterative.smk``, ``deploy.smk``, ``frontier.smk``): each artifact's input files, its spec as the
``--spec`` JSON, and its title in the Snakemake report (a base of ``coec.workflow.wiring.Wiring``)."""

from __future__ import annotations

import json
import re
from typing import Any

from coec.iterative import targets as iterative_targets
from coec.report import frontier
from coec.workflow.targets import claims, figures, report_labels, tables
from coec.workflow.targets import measured as deploy_spec

Wildcards = Any


def _spec_json(spec: dict[str, Any]) -> str:
    return json.dumps(spec)


class ArtifactWiring:
    """Inputs, ``--spec`` and report labels of one validated config's tables and figures."""

    config: dict[str, Any]

    # ------------------------------------------------------------------------- tables 1-3, extra
    def table_constraint(self) -> str:
        """A regex of the generic table rule's names: table1-3 and the config's extra tables."""
        extra = self.config.get("extra_tables") or {}
        return r"table[123]|" + "|".join(re.escape(n) for n in extra) if extra else r"table[123]|table_none"

    def table_inputs(self, wc: Wildcards) -> list[str]:
        return tables.table_inputs(self.config, wc.table)

    def table_spec(self, wc: Wildcards) -> str:
        spec = tables.table_spec(self.config, wc.table, tables.table_file(self.config, wc.table))
        return _spec_json(spec)

    def table4_inputs(self, wc: Wildcards) -> list[str]:
        return tables.table4_inputs(self.config)

    def table4_spec(self, wc: Wildcards) -> str:
        return _spec_json(tables.table4_spec(self.config))

    # ------------------------------------------------------------------------- figures, App. C, claims
    def fig2_inputs(self, wc: Wildcards) -> list[str]:
        return figures.figure_inputs(figures.fig2_spec(self.config))

    def fig2_spec(self, wc: Wildcards) -> str:
        return _spec_json(figures.fig2_spec(self.config))

    def appc_inputs(self, wc: Wildcards) -> str:
        return figures.appc_geometry(self.config)

    def appc_spec(self, wc: Wildcards) -> str:
        return _spec_json(figures.appc_spec(self.config))

    def claims_inputs(self, wc: Wildcards) -> list[str]:
        return claims.claims_inputs(self.config)

    def claims_spec(self, wc: Wildcards) -> str:
        return _spec_json(claims.claims_spec(self.config))

    # ------------------------------------------------------------------------- iterative method
    def iterative_table_inputs(self, wc: Wildcards) -> list[str]:
        return tables.spec_inputs(iterative_targets.table_spec(self.config))

    def iterative_table_spec(self, wc: Wildcards) -> str:
        return _spec_json(iterative_targets.table_spec(self.config))

    def iterative_zeroshot_inputs(self, wc: Wildcards) -> list[str]:
        return tables.spec_inputs(iterative_targets.zeroshot_table_spec(self.config))

    def iterative_zeroshot_spec(self, wc: Wildcards) -> str:
        return _spec_json(iterative_targets.zeroshot_table_spec(self.config))

    def iterative_size_inputs(self, wc: Wildcards) -> list[str]:
        return figures.figure_inputs(iterative_targets.size_spec(self.config))

    def iterative_size_spec(self, wc: Wildcards) -> str:
        return _spec_json(iterative_targets.size_spec(self.config))

    # ------------------------------------------------------------------------- measured tables
    def measured_inputs(self, wc: Wildcards) -> list[str]:
        """Table 4 measured: the exports and perplexities it times (``coec.workflow.targets.measured``)."""
        return list(deploy_spec.measured_inputs(self.config))

    def measured_spec(self, wc: Wildcards) -> str:
        return _spec_json(deploy_spec.measured_spec(self.config))

    def frontier_speed_inputs(self, wc: Wildcards) -> list[str]:
        return list(frontier.speed_inputs(self.config))

    def frontier_speed_spec(self, wc: Wildcards) -> str:
        return _spec_json(frontier.speed_spec(self.config))

    def frontier_inputs(self, wc: Wildcards) -> list[str]:
        return list(frontier.frontier_inputs(self.config))

    def frontier_spec(self, wc: Wildcards) -> str:
        return _spec_json(frontier.frontier_spec(self.config))

    # ------------------------------------------------------------------------- results/README.md, report
    def report_inputs(self, wc: Wildcards) -> list[str]:
        """Every table and figure of results/README.md."""
        return [p for p, _, _ in report_labels.report_items(self.config)]

    def readme_spec(self, configfiles: list[str]) -> str:
        """--spec of results/README.md, naming the config files (relative to the repository)."""
        return _spec_json(report_labels.readme_spec(self.config, configfiles))

    def report_label(self, pattern: str, wc: Wildcards) -> dict[str, str]:
        """The label of an artifact in the Snakemake report: its title; ``pattern`` is its path,
        with the job's wildcards (``results/{table}.csv``)."""
        return report_labels.report_label(self.config, pattern.format(**dict(wc.items())))

    def report_table_kind(self, wc: Wildcards) -> str:
        """A table's subcategory in the report: what its numbers are."""
        return report_labels.report_table_kind(self.config, wc.table)
