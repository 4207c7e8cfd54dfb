"""The evaluation directory the pipeline's `evaluate` step writes (`WORK/evaluations/NAME`), and how it is logged: the
one owner of its file names, which the step, the comparison of two evaluations and the dashboard all read.

    evaluation.json   the report (`pipelines.evaluate`)
    dashboard.html    the run's dashboard page (`recsys.dashboard`)
    per_user.npz      every user's rank (`recsys.artifacts.per_user.PER_USER_FILE`)
    search_ranks.npz  a model that reads queries: every user's rank per search level and setting
                      (`recsys.artifacts.per_user.SEARCH_RANKS_FILE`)

With tracking on, the directory is the artifact `evaluation/` of an MLflow run named `evaluate`.
"""

EVALUATION_FILE = "evaluation.json"
DASHBOARD_FILE = "dashboard.html"
EVALUATE_RUN_NAME = "evaluate"
EVALUATION_ARTIFACT_DIR = "evaluation"
EVALUATION_ARTIFACT = f"{EVALUATION_ARTIFACT_DIR}/{EVALUATION_FILE}"
