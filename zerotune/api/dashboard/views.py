"""The dashboard's routes: HTML pages (left out of the OpenAPI schema) and two documented JSON aggregates.

Shareable URLs: ``/dashboard`` (studies), ``/dashboard/studies/{id}``, ``/dashboard/trials/{id}``,
``/dashboard/recommendations/{id}``, ``/dashboard/compare?trials=1,2,3`` (or
``?study=ID&strategies=zero3,zeropp,3level-a``); ``/`` redirects to ``/dashboard``. Read-only, no login.
"""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from sqlalchemy import Engine

from zerotune.api import queries
from zerotune.api.dashboard import pages
from zerotune.api.deps import Id, SessionDep
from zerotune.api.schemas import MAX_ID, Message, ParamImportancePublic, TrialPointsPublic
from zerotune.db import repository as repo
from zerotune.db.migrate import has_optuna_tables
from zerotune.db.models import Study
from zerotune.errors import NotFoundError

HERE = Path(__file__).resolve().parent
templates = Jinja2Templates(directory=HERE / "templates")
router = APIRouter()
MAX_COMPARE = 12


def plotly_js() -> Path | None:
    """plotly.min.js from the installed ``plotly`` package (found without importing it), or None."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "package_data" / "plotly.min.js"
    return path if path.is_file() else None


class Importances:
    """Parameter importance per study, computed by Optuna from its own storage on the service's database,
    and kept until the study's trials change (a finished study is computed once)."""

    def __init__(self, url: str, engine: Engine) -> None:
        self.url, self.engine = url, engine
        self._storage: Any = None
        self._lock = threading.Lock()
        self._cache: dict[int, tuple[tuple[Any, ...], ParamImportancePublic]] = {}

    def storage(self) -> Any:
        """Optuna's RDBStorage on our database, or None while Optuna's tables do not exist (no study ran)."""
        if self._storage is None:
            if not has_optuna_tables(self.engine):
                return None
            import optuna

            self._storage = optuna.storages.RDBStorage(self.url, skip_table_creation=True)
        return self._storage

    def get(self, session: Any, study: Study) -> ParamImportancePublic:
        detail = queries.study_detail(session, study)
        version = (study.state, tuple(sorted(detail.trial_counts.items())))
        cached = self._cache.get(study.id)
        if cached is not None and cached[0] == version:
            return cached[1]
        with self._lock:  # one computation at a time: a page opened by many users costs one
            storage = self.storage()
            if storage is None:
                result = ParamImportancePublic(study_id=study.id, method=queries.IMPORTANCE_METHOD, trials_used=0,
                                               data=[], note="no Optuna study is stored in this database yet")
            else:
                result = queries.param_importance(study_id=study.id, optuna_study_name=study.optuna_study_name,
                                                  storage=storage)
            if len(self._cache) > 256:
                self._cache.clear()
            self._cache[study.id] = (version, result)
            return result


def install(app: FastAPI) -> None:
    """Add the dashboard to ``app``: its routes, its static files and plotly.js."""
    service = app.state.service
    app.state.importances = Importances(service.url, service.engine)
    app.include_router(router)
    app.mount("/dashboard/static", StaticFiles(directory=HERE / "static"), name="dashboard-static")


# --- the JSON aggregates (in the OpenAPI schema) ------------------------------------------------


def _study(session: Any, study_id: int) -> Study:
    study = repo.get_study(session=session, study_id=study_id)
    if study is None:
        raise NotFoundError("study", study_id)
    return study


@router.get("/v1/studies/{study_id}/points", response_model=TrialPointsPublic, tags=["studies"],
            responses={404: {"model": Message}})
def read_study_points(study_id: Id, session: SessionDep,
                      offset: Annotated[int, Query(ge=0, le=MAX_ID, description="rows to skip")] = 0,
                      limit: Annotated[int, Query(ge=1, le=500, description="rows per page")] = 500,
                      ) -> TrialPointsPublic:
    """A study's trials as the dashboard draws them: objective, peak memory, inter-node bytes, and the
    predicted beside the measured step time (the cost model's error), in the order they were added."""
    return queries.trial_points(session, _study(session, study_id), offset=offset, limit=limit)


@router.get("/v1/studies/{study_id}/importance", response_model=ParamImportancePublic, tags=["studies"],
            responses={404: {"model": Message}})
def read_study_importance(study_id: Id, session: SessionDep, request: Request) -> ParamImportancePublic:
    """Which strategy dimension mattered: Optuna's PED-ANOVA importance over the complete, feasible
    trials of the study's Optuna study (empty, with a note, below 2 such trials)."""
    importances: Importances = request.app.state.importances
    return importances.get(session, _study(session, study_id))


# --- the pages (not in the OpenAPI schema) --------------------------------------------------------


def _render(request: Request, name: str, context: dict[str, Any], status_code: int = 200) -> HTMLResponse:
    return templates.TemplateResponse(request, name, context, status_code=status_code)


def _not_found(request: Request, what: str, hint: str) -> HTMLResponse:
    return _render(request, "not_found.html", {"what": what, "hint": hint, "data": {}}, status_code=404)


def _id(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() and 1 <= int(text) <= MAX_ID else None


@router.get("/", include_in_schema=False)
def root() -> RedirectResponse:
    return RedirectResponse("/dashboard")


@router.get("/dashboard/vendor/plotly.min.js", include_in_schema=False)
def read_plotly_js() -> Response:
    path = plotly_js()
    if path is None:
        return Response("/* plotly is not installed: pip install plotly */", status_code=404,
                        media_type="text/javascript")
    return FileResponse(path, media_type="text/javascript", headers={"Cache-Control": "public, max-age=86400"})


@router.get("/dashboard", include_in_schema=False, response_class=HTMLResponse)
def studies_page(request: Request, session: SessionDep,
                 page: Annotated[int, Query(ge=1, le=1_000_000)] = 1) -> HTMLResponse:
    return _render(request, "studies.html", pages.studies_page(session, page))


@router.get("/dashboard/studies/{study_id}", include_in_schema=False, response_class=HTMLResponse)
def study_page(request: Request, study_id: str, session: SessionDep) -> HTMLResponse:
    number = _id(study_id)
    study = repo.get_study(session=session, study_id=number) if number else None
    if study is None:
        return _not_found(request, f"study {study_id}", "The studies page lists every study this service holds.")
    return _render(request, "study.html", pages.study_page(session, study))


@router.get("/dashboard/trials/{trial_id}", include_in_schema=False, response_class=HTMLResponse)
def trial_page(request: Request, trial_id: str, session: SessionDep) -> HTMLResponse:
    number = _id(trial_id)
    trial = repo.get_trial(session=session, trial_id=number) if number else None
    if trial is None:
        return _not_found(request, f"trial {trial_id}", "Open a study to see its trials.")
    return _render(request, "trial.html", pages.trial_page(session, trial))


@router.get("/dashboard/recommendations/{recommendation_id}", include_in_schema=False,
            response_class=HTMLResponse)
def recommendation_page(request: Request, recommendation_id: str, session: SessionDep) -> HTMLResponse:
    number = _id(recommendation_id)
    row = repo.get_recommendation(session=session, recommendation_id=number) if number else None
    if row is None:
        return _not_found(request, f"recommendation {recommendation_id}",
                          "A study links its recommendation once it is done.")
    return _render(request, "recommendation.html", pages.recommendation_page(session, row))


@router.get("/dashboard/compare", include_in_schema=False, response_class=HTMLResponse)
def compare_page(request: Request, session: SessionDep,
                 trials: Annotated[str, Query(max_length=1000)] = "",
                 study: Annotated[str, Query(max_length=20)] = "",
                 strategies: Annotated[str, Query(max_length=1000)] = "") -> HTMLResponse:
    words = [w for w in trials.replace(" ", ",").split(",") if w]
    ids = [i for i in map(_id, words) if i is not None]
    bad = [w for w in words if _id(w) is None]
    study_id = _id(study) if study else None
    names = [n for n in strategies.replace(" ", ",").split(",") if n]
    chosen, missing = pages.compare_trials(session, ids[:MAX_COMPARE], study_id, names)
    missing = [f"'{w}' is not a trial id" for w in bad] + missing
    if study and study_id is None:
        missing.append(f"'{study}' is not a study id")
    context = pages.compare_page(session, chosen[:MAX_COMPARE], missing)
    return _render(request, "compare.html", {**context, "query": {"trials": trials, "study": study,
                                                                  "strategies": strategies}})
