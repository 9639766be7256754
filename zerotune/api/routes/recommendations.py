"""POST a model and a cluster, get a recommended config (or a job that will produce it)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.concurrency import run_in_threadpool

from zerotune.api import queries
from zerotune.api.deps import Id, ServiceDep, SessionDep, WriteAccess
from zerotune.api.inputs import JobMeasurementsCreate, RecommendationCreate
from zerotune.api.prologue.outputs import ENV_FILES, TOOL_FILES
from zerotune.api.schemas import JobPublic, Message, RecommendationPublic, ValidationErrorPublic
from zerotune.api.settings import MAX_WAIT_S, Settings
from zerotune.api.uploads import job_shortlist, store_job_measurements
from zerotune.db import repository as repo
from zerotune.db.session import session_scope
from zerotune.errors import InputError, NotFoundError, StudyFailed

router = APIRouter(prefix="/v1/recommendations", tags=["recommendations"])

WAIT = (f"hold the request up to this many seconds for the answer, and at most the service's ZEROTUNE_WAIT_MAX_S "
        f"({Settings.model_fields['wait_max_s'].default:g} s unless set; a longer wait is held that long)")


@router.post(
    "", status_code=200, response_model=RecommendationPublic, dependencies=[WriteAccess],
    responses={
        200: {"description": "An equivalent request was answered before (or the job finished within ?wait)."},
        202: {"model": JobPublic, "description": "A job will answer: poll the Location (its state says queued, "
              "running, or why it failed or was cancelled).",
              "headers": {"Location": {"description": "/v1/jobs/{id}", "schema": {"type": "string"}}}},
        401: {"model": Message, "description": "ZEROTUNE_TOKEN is set and the bearer token is missing or wrong."}})
async def create_recommendation(
    body: RecommendationCreate, service: ServiceDep, request: Request,
    wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S, description=WAIT)]
    = 0,
) -> Response:
    """Recommend a partition strategy for a model on a cluster.

    The request is normalized (presets expanded, defaults filled) and hashed. A stored answer
    comes back at once (200); otherwise the request joins the one job of its equivalence class
    (202, ``Location: /v1/jobs/{id}``), however many identical requests arrive at once.
    """
    tune = await service.normalize(body)
    outcome = await service.answer(tune, wait)
    request.state.request_key = tune.key()  # a valid body: the fast path may answer it next time
    if outcome.answer is not None:
        return Response(outcome.answer, media_type="application/json")
    assert outcome.job is not None
    return Response(outcome.job.model_dump_json(), status_code=202, media_type="application/json",
                    headers={"Location": f"/v1/jobs/{outcome.job.id}"})


@router.get(
    "/{recommendation_id}", response_model=None,
    responses={200: {"model": RecommendationPublic | dict[str, Any],
                     "description": "The recommendation, or with ?format= one export as a file.",
                     "content": {"application/toml": {"schema": {"type": "string"}},
                                 "application/yaml": {"schema": {"type": "string"}}}},
               404: {"model": Message}})
def read_recommendation(
    recommendation_id: Id, session: SessionDep,
    format: Annotated[Literal["zerotune", "deepspeed", "fsdp", "torchtitan", "accelerate", "hf-trainer"] | None,
                      Query(description="download one export: zerotune trainer JSON, DeepSpeed config, FSDP2, "
                                        "torchtitan TOML, accelerate launch YAML, the HF Trainer's DeepSpeed config "
                                        "(\"auto\" where TrainingArguments set it)")] = None,
    plugin: Annotated[Literal["fsdp", "deepspeed"],
                      Query(description="with format=accelerate: the FSDP2 plugin's YAML or the DeepSpeed plugin's "
                                        "(reading the DeepSpeed export as ds_config.json)")] = "fsdp",
) -> Any:
    """A stored recommendation, or one of its exports."""
    row = repo.get_recommendation(session=session, recommendation_id=recommendation_id)
    if row is None:
        raise NotFoundError("recommendation", recommendation_id)
    if format is None:
        return queries.recommendation_public(row)
    if format in ENV_FILES:
        return JSONResponse(row.exports.get(format) or {}, headers={
            "Content-Disposition": f'attachment; filename="{ENV_FILES[format]}"'})
    export = row.exports.get(format) or _rebuilt(row.exports, format)
    if format == "hf-trainer":
        return JSONResponse(export["config"], headers={
            "Content-Disposition": f'attachment; filename="{TOOL_FILES[format]}"'})
    if format == "torchtitan":
        text, name, media = export["toml"], TOOL_FILES["torchtitan"], "application/toml"
    else:
        text, name = (export["fsdp_yaml"], TOOL_FILES["accelerate"]) if plugin == "fsdp" else (
            export["deepspeed_yaml"], TOOL_FILES["accelerate-deepspeed"])
        media = "application/yaml"
    return PlainTextResponse(text, media_type=media, headers={"Content-Disposition": f'attachment; filename="{name}"'})


def _rebuilt(exports: dict[str, Any], format: str) -> dict[str, Any]:
    """An export an answer stored before its format existed, built from the answer's own model, cluster, strategy
    and batch (its zerotune export)."""
    from zerotune.core.spec import ClusterSpec, ModelSpec, Strategy
    from zerotune.tuner.exports import all_exports

    zt = exports.get("zerotune") or {}
    if not all(k in zt for k in ("model", "cluster", "strategy")):
        raise NotFoundError("export", format)
    built = all_exports(ModelSpec.from_dict(zt["model"]), ClusterSpec.from_dict(zt["cluster"]),
                        Strategy.from_dict(zt["strategy"]), zt.get("global_batch"))
    return dict(built[format])


@router.get("/{recommendation_id}/shortlist", responses={404: {"model": Message}})
def read_shortlist(recommendation_id: Id, session: SessionDep) -> dict[str, Any]:
    """What a training job measures of this answer (``zerotune recommend --measure``): the partitions the model
    cannot tell apart (the service's own shortlist), as strategies, with why; none, and why, for an answer that
    is measured already or whose winner leads beyond the model's error."""
    return job_shortlist(session=session, recommendation_id=recommendation_id)


@router.post(
    "/{recommendation_id}/measurements", response_model=RecommendationPublic, status_code=201,
    dependencies=[WriteAccess],
    responses={200: {"model": RecommendationPublic,
                     "description": "This job's measurements were stored before: the answer they made."},
               201: {"description": "Stored as trials of the request, the cluster's calibration refitted, and the "
                                    "request answered from them."},
               401: {"model": Message}, 404: {"model": Message},
               422: {"model": ValidationErrorPublic, "description": "A run of another model or shape than the "
                     "request's, an unknown strategy, or no run that completed."}})
async def create_measurements(recommendation_id: Id, body: JobMeasurementsCreate, service: ServiceDep,
                              response: Response) -> RecommendationPublic:
    """Store a training job's measurements of this answer's shortlist: its run.json files become trials of the
    request, the cluster's calibration is refitted from them, and the measured winner answers the request from
    now on (the next job of the same request and allocation shape is served it)."""
    def store() -> tuple[RecommendationPublic, bytes, bool]:
        try:
            rec_id, created = store_job_measurements(
                sessions=service.sessions, recommendation_id=recommendation_id, body=body,
                workdir=service.settings.work_root() / f"job-measurements-{recommendation_id}")
        except StudyFailed as exc:
            raise InputError("body.runs", len(body.runs), f"no run completed: {exc}") from None
        with session_scope(service.sessions) as s:
            row = repo.get_recommendation(session=s, recommendation_id=rec_id)
            assert row is not None
            return queries.recommendation_public(row), queries.answer_bytes(row), created

    rec, answer, created = await run_in_threadpool(store)
    # a body resolved before may now resolve to the refitted calibration, and every key of the request (whatever
    # calibration it names) is answered from the measurements now: forget what was cached
    service.cache.bodies.clear()
    service.cache.answers.clear()
    service.cache.put(rec.request_key, answer)
    response.status_code = 201 if created else 200
    return rec
