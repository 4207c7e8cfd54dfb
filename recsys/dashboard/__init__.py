"""The offline evaluation dashboard: data gathered from MLflow (`data`), one self-contained HTML page (`render`).

Served at `GET /dashboard` (serving/routers/dashboard.py) and written by the pipeline's `evaluate` step as
`dashboard.html` (an MLflow artifact of that step's run).
"""

from recsys.dashboard.data import (
    DashboardData,
    DashboardUnavailable,
    Evaluation,
    RunSummary,
    from_evaluation,
    from_mlflow,
)
from recsys.dashboard.render import render_dashboard, render_message

__all__ = [
    "DashboardData",
    "DashboardUnavailable",
    "Evaluation",
    "RunSummary",
    "from_evaluation",
    "from_mlflow",
    "render_dashboard",
    "render_message",
]
