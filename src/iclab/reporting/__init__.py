"""Figures and the reproduction report: ``runs/report.md`` and the static HTML site ``runs/report/``."""

from iclab.reporting.report import write_report as write_report
from iclab.reporting.site import screenshot as screenshot
from iclab.reporting.site import write_site as write_site

__all__ = ["screenshot", "write_report", "write_site"]
