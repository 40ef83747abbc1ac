from torchfarm.v1 import graph_pb2 as _graph_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    QUEUED: _ClassVar[JobState]
    RUNNING: _ClassVar[JobState]
    SUCCEEDED: _ClassVar[JobState]
    FAILED: _ClassVar[JobState]
JOB_STATE_UNSPECIFIED: JobState
QUEUED: JobState
RUNNING: JobState
SUCCEEDED: JobState
FAILED: JobState

class Target(_message.Message):
    __slots__ = ("device", "arch", "isa", "compiler")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    ARCH_FIELD_NUMBER: _ClassVar[int]
    ISA_FIELD_NUMBER: _ClassVar[int]
    COMPILER_FIELD_NUMBER: _ClassVar[int]
    device: str
    arch: str
    isa: str
    compiler: str
    def __init__(self, device: _Optional[str] = ..., arch: _Optional[str] = ..., isa: _Optional[str] = ..., compiler: _Optional[str] = ...) -> None: ...

class Build(_message.Message):
    __slots__ = ("torch_version", "torch_git", "triton_version", "python", "platform")
    TORCH_VERSION_FIELD_NUMBER: _ClassVar[int]
    TORCH_GIT_FIELD_NUMBER: _ClassVar[int]
    TRITON_VERSION_FIELD_NUMBER: _ClassVar[int]
    PYTHON_FIELD_NUMBER: _ClassVar[int]
    PLATFORM_FIELD_NUMBER: _ClassVar[int]
    torch_version: str
    torch_git: str
    triton_version: str
    python: str
    platform: str
    def __init__(self, torch_version: _Optional[str] = ..., torch_git: _Optional[str] = ..., triton_version: _Optional[str] = ..., python: _Optional[str] = ..., platform: _Optional[str] = ...) -> None: ...

class CompileOptions(_message.Message):
    __slots__ = ("mode", "inductor", "dynamic", "no_grad", "autocast", "sdpa_backends", "deterministic", "deterministic_warn_only")
    MODE_FIELD_NUMBER: _ClassVar[int]
    INDUCTOR_FIELD_NUMBER: _ClassVar[int]
    DYNAMIC_FIELD_NUMBER: _ClassVar[int]
    NO_GRAD_FIELD_NUMBER: _ClassVar[int]
    AUTOCAST_FIELD_NUMBER: _ClassVar[int]
    SDPA_BACKENDS_FIELD_NUMBER: _ClassVar[int]
    DETERMINISTIC_FIELD_NUMBER: _ClassVar[int]
    DETERMINISTIC_WARN_ONLY_FIELD_NUMBER: _ClassVar[int]
    mode: str
    inductor: _containers.RepeatedCompositeFieldContainer[Option]
    dynamic: bool
    no_grad: bool
    autocast: _containers.RepeatedCompositeFieldContainer[Autocast]
    sdpa_backends: _containers.RepeatedScalarFieldContainer[str]
    deterministic: bool
    deterministic_warn_only: bool
    def __init__(self, mode: _Optional[str] = ..., inductor: _Optional[_Iterable[_Union[Option, _Mapping]]] = ..., dynamic: _Optional[bool] = ..., no_grad: _Optional[bool] = ..., autocast: _Optional[_Iterable[_Union[Autocast, _Mapping]]] = ..., sdpa_backends: _Optional[_Iterable[str]] = ..., deterministic: _Optional[bool] = ..., deterministic_warn_only: _Optional[bool] = ...) -> None: ...

class Autocast(_message.Message):
    __slots__ = ("device_type", "dtype")
    DEVICE_TYPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    device_type: str
    dtype: str
    def __init__(self, device_type: _Optional[str] = ..., dtype: _Optional[str] = ...) -> None: ...

class Option(_message.Message):
    __slots__ = ("name", "json_value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    JSON_VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    json_value: str
    def __init__(self, name: _Optional[str] = ..., json_value: _Optional[str] = ...) -> None: ...

class CompileRequest(_message.Message):
    __slots__ = ("graph", "target", "build", "options", "label", "specialize_hints", "per_rank", "export")
    GRAPH_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    BUILD_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    SPECIALIZE_HINTS_FIELD_NUMBER: _ClassVar[int]
    PER_RANK_FIELD_NUMBER: _ClassVar[int]
    EXPORT_FIELD_NUMBER: _ClassVar[int]
    graph: _graph_pb2.Graph
    target: Target
    build: Build
    options: CompileOptions
    label: str
    specialize_hints: bool
    per_rank: bool
    export: ExportSpec
    def __init__(self, graph: _Optional[_Union[_graph_pb2.Graph, _Mapping]] = ..., target: _Optional[_Union[Target, _Mapping]] = ..., build: _Optional[_Union[Build, _Mapping]] = ..., options: _Optional[_Union[CompileOptions, _Mapping]] = ..., label: _Optional[str] = ..., specialize_hints: _Optional[bool] = ..., per_rank: _Optional[bool] = ..., export: _Optional[_Union[ExportSpec, _Mapping]] = ...) -> None: ...

class ExportSpec(_message.Message):
    __slots__ = ("weights", "in_spec", "out_spec", "dims")
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    IN_SPEC_FIELD_NUMBER: _ClassVar[int]
    OUT_SPEC_FIELD_NUMBER: _ClassVar[int]
    DIMS_FIELD_NUMBER: _ClassVar[int]
    weights: _containers.RepeatedCompositeFieldContainer[ExportWeight]
    in_spec: str
    out_spec: str
    dims: _containers.RepeatedCompositeFieldContainer[ExportDim]
    def __init__(self, weights: _Optional[_Iterable[_Union[ExportWeight, _Mapping]]] = ..., in_spec: _Optional[str] = ..., out_spec: _Optional[str] = ..., dims: _Optional[_Iterable[_Union[ExportDim, _Mapping]]] = ...) -> None: ...

class ExportWeight(_message.Message):
    __slots__ = ("placeholder", "fqn", "kind", "persistent", "dtype", "shape", "data")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[ExportWeight.Kind]
        PARAMETER: _ClassVar[ExportWeight.Kind]
        BUFFER: _ClassVar[ExportWeight.Kind]
        CONSTANT: _ClassVar[ExportWeight.Kind]
    KIND_UNSPECIFIED: ExportWeight.Kind
    PARAMETER: ExportWeight.Kind
    BUFFER: ExportWeight.Kind
    CONSTANT: ExportWeight.Kind
    PLACEHOLDER_FIELD_NUMBER: _ClassVar[int]
    FQN_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PERSISTENT_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    placeholder: str
    fqn: str
    kind: ExportWeight.Kind
    persistent: bool
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, placeholder: _Optional[str] = ..., fqn: _Optional[str] = ..., kind: _Optional[_Union[ExportWeight.Kind, str]] = ..., persistent: _Optional[bool] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class ExportDim(_message.Message):
    __slots__ = ("symbol", "min", "max")
    SYMBOL_FIELD_NUMBER: _ClassVar[int]
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    symbol: str
    min: int
    max: int
    def __init__(self, symbol: _Optional[str] = ..., min: _Optional[int] = ..., max: _Optional[int] = ...) -> None: ...

class JobError(_message.Message):
    __slots__ = ()
    class Code(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        CODE_UNSPECIFIED: _ClassVar[JobError.Code]
        COMPILE_ERROR: _ClassVar[JobError.Code]
        COMPILE_TIMEOUT: _ClassVar[JobError.Code]
        BUILD_MISMATCH: _ClassVar[JobError.Code]
        INVALID_GRAPH: _ClassVar[JobError.Code]
        MALFORMED_REQUEST: _ClassVar[JobError.Code]
        REQUEST_EXPIRED: _ClassVar[JobError.Code]
        TOO_MANY_ATTEMPTS: _ClassVar[JobError.Code]
        ARTIFACT_TOO_LARGE: _ClassVar[JobError.Code]
        OPTION_NOT_ALLOWED: _ClassVar[JobError.Code]
        PLAN_EXPIRED: _ClassVar[JobError.Code]
        KERNELS_LOST: _ClassVar[JobError.Code]
        UNSHIPPABLE_GUARD: _ClassVar[JobError.Code]
        INVALID_KERNEL: _ClassVar[JobError.Code]
        KERNEL_COMPILE_ERROR: _ClassVar[JobError.Code]
        KERNEL_TIMEOUT: _ClassVar[JobError.Code]
        WRONG_TARGET: _ClassVar[JobError.Code]
        RECORD_TAMPERED: _ClassVar[JobError.Code]
        INVALID_KERNEL_SPEC: _ClassVar[JobError.Code]
        RANK_SPECIFIC: _ClassVar[JobError.Code]
        WORKER_FAULT: _ClassVar[JobError.Code]
    CODE_UNSPECIFIED: JobError.Code
    COMPILE_ERROR: JobError.Code
    COMPILE_TIMEOUT: JobError.Code
    BUILD_MISMATCH: JobError.Code
    INVALID_GRAPH: JobError.Code
    MALFORMED_REQUEST: JobError.Code
    REQUEST_EXPIRED: JobError.Code
    TOO_MANY_ATTEMPTS: JobError.Code
    ARTIFACT_TOO_LARGE: JobError.Code
    OPTION_NOT_ALLOWED: JobError.Code
    PLAN_EXPIRED: JobError.Code
    KERNELS_LOST: JobError.Code
    UNSHIPPABLE_GUARD: JobError.Code
    INVALID_KERNEL: JobError.Code
    KERNEL_COMPILE_ERROR: JobError.Code
    KERNEL_TIMEOUT: JobError.Code
    WRONG_TARGET: JobError.Code
    RECORD_TAMPERED: JobError.Code
    INVALID_KERNEL_SPEC: JobError.Code
    RANK_SPECIFIC: JobError.Code
    WORKER_FAULT: JobError.Code
    def __init__(self) -> None: ...

class Failure(_message.Message):
    __slots__ = ()
    class Reason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        REASON_UNSPECIFIED: _ClassVar[Failure.Reason]
        INTERNAL: _ClassVar[Failure.Reason]
        INVALID_REQUEST: _ClassVar[Failure.Reason]
        REQUEST_TOO_LARGE: _ClassVar[Failure.Reason]
        TENANT_QUEUE_FULL: _ClassVar[Failure.Reason]
        NO_WORKER: _ClassVar[Failure.Reason]
        NOT_FOUND: _ClassVar[Failure.Reason]
        ARTIFACT_CORRUPT: _ClassVar[Failure.Reason]
        BACKEND_UNAVAILABLE: _ClassVar[Failure.Reason]
        UNAUTHENTICATED: _ClassVar[Failure.Reason]
        MALFORMED_REQUEST: _ClassVar[Failure.Reason]
        UNKNOWN_TARGET: _ClassVar[Failure.Reason]
        OPTION_NOT_ALLOWED: _ClassVar[Failure.Reason]
        GRAPH_TOO_LARGE: _ClassVar[Failure.Reason]
        DISALLOWED_OP: _ClassVar[Failure.Reason]
        INVALID_GRAPH: _ClassVar[Failure.Reason]
        INVALID_KERNEL: _ClassVar[Failure.Reason]
        KERNEL_FAILED: _ClassVar[Failure.Reason]
        KERNEL_TIMEOUT: _ClassVar[Failure.Reason]
        KERNEL_EVICTED: _ClassVar[Failure.Reason]
        NOTHING_TO_EVICT: _ClassVar[Failure.Reason]
        INVALID_FILTER: _ClassVar[Failure.Reason]
        AMBIGUOUS_KEY: _ClassVar[Failure.Reason]
        KERNEL_COMPILE_ERROR: _ClassVar[Failure.Reason]
        WATCH_LIMIT: _ClassVar[Failure.Reason]
        AUTH_THROTTLED: _ClassVar[Failure.Reason]
        BUILD_NOT_SERVED: _ClassVar[Failure.Reason]
        STORAGE_QUOTA: _ClassVar[Failure.Reason]
        UPLOAD_RATE: _ClassVar[Failure.Reason]
        EXPLAIN_RATE: _ClassVar[Failure.Reason]
        FETCH_LIMIT: _ClassVar[Failure.Reason]
        LISTING_LIMIT: _ClassVar[Failure.Reason]
    REASON_UNSPECIFIED: Failure.Reason
    INTERNAL: Failure.Reason
    INVALID_REQUEST: Failure.Reason
    REQUEST_TOO_LARGE: Failure.Reason
    TENANT_QUEUE_FULL: Failure.Reason
    NO_WORKER: Failure.Reason
    NOT_FOUND: Failure.Reason
    ARTIFACT_CORRUPT: Failure.Reason
    BACKEND_UNAVAILABLE: Failure.Reason
    UNAUTHENTICATED: Failure.Reason
    MALFORMED_REQUEST: Failure.Reason
    UNKNOWN_TARGET: Failure.Reason
    OPTION_NOT_ALLOWED: Failure.Reason
    GRAPH_TOO_LARGE: Failure.Reason
    DISALLOWED_OP: Failure.Reason
    INVALID_GRAPH: Failure.Reason
    INVALID_KERNEL: Failure.Reason
    KERNEL_FAILED: Failure.Reason
    KERNEL_TIMEOUT: Failure.Reason
    KERNEL_EVICTED: Failure.Reason
    NOTHING_TO_EVICT: Failure.Reason
    INVALID_FILTER: Failure.Reason
    AMBIGUOUS_KEY: Failure.Reason
    KERNEL_COMPILE_ERROR: Failure.Reason
    WATCH_LIMIT: Failure.Reason
    AUTH_THROTTLED: Failure.Reason
    BUILD_NOT_SERVED: Failure.Reason
    STORAGE_QUOTA: Failure.Reason
    UPLOAD_RATE: Failure.Reason
    EXPLAIN_RATE: Failure.Reason
    FETCH_LIMIT: Failure.Reason
    LISTING_LIMIT: Failure.Reason
    def __init__(self) -> None: ...

class ArtifactRejection(_message.Message):
    __slots__ = ()
    class Reason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        REASON_UNSPECIFIED: _ClassVar[ArtifactRejection.Reason]
        UNSIGNED: _ClassVar[ArtifactRejection.Reason]
        UNKNOWN_KEY: _ClassVar[ArtifactRejection.Reason]
        EXPIRED: _ClassVar[ArtifactRejection.Reason]
        NOT_YET_VALID: _ClassVar[ArtifactRejection.Reason]
        INVALID: _ClassVar[ArtifactRejection.Reason]
        MISMATCH: _ClassVar[ArtifactRejection.Reason]
        FINGERPRINT: _ClassVar[ArtifactRejection.Reason]
        DIGEST: _ClassVar[ArtifactRejection.Reason]
        MALFORMED: _ClassVar[ArtifactRejection.Reason]
        UNTRUSTED_FARM: _ClassVar[ArtifactRejection.Reason]
        CORRUPT: _ClassVar[ArtifactRejection.Reason]
        TOO_LARGE: _ClassVar[ArtifactRejection.Reason]
        GUARDS: _ClassVar[ArtifactRejection.Reason]
        WRONG_ARCH: _ClassVar[ArtifactRejection.Reason]
        BAD_KERNEL: _ClassVar[ArtifactRejection.Reason]
        KERNEL_INSTALL: _ClassVar[ArtifactRejection.Reason]
        DESERIALIZE: _ClassVar[ArtifactRejection.Reason]
        ISA: _ClassVar[ArtifactRejection.Reason]
    REASON_UNSPECIFIED: ArtifactRejection.Reason
    UNSIGNED: ArtifactRejection.Reason
    UNKNOWN_KEY: ArtifactRejection.Reason
    EXPIRED: ArtifactRejection.Reason
    NOT_YET_VALID: ArtifactRejection.Reason
    INVALID: ArtifactRejection.Reason
    MISMATCH: ArtifactRejection.Reason
    FINGERPRINT: ArtifactRejection.Reason
    DIGEST: ArtifactRejection.Reason
    MALFORMED: ArtifactRejection.Reason
    UNTRUSTED_FARM: ArtifactRejection.Reason
    CORRUPT: ArtifactRejection.Reason
    TOO_LARGE: ArtifactRejection.Reason
    GUARDS: ArtifactRejection.Reason
    WRONG_ARCH: ArtifactRejection.Reason
    BAD_KERNEL: ArtifactRejection.Reason
    KERNEL_INSTALL: ArtifactRejection.Reason
    DESERIALIZE: ArtifactRejection.Reason
    ISA: ArtifactRejection.Reason
    def __init__(self) -> None: ...

class Stage(_message.Message):
    __slots__ = ()
    class Name(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        NAME_UNSPECIFIED: _ClassVar[Stage.Name]
        DECODE: _ClassVar[Stage.Name]
        COMPILE: _ClassVar[Stage.Name]
        DECOMPOSING: _ClassVar[Stage.Name]
        LOWERING: _ClassVar[Stage.Name]
        KERNELS: _ClassVar[Stage.Name]
        ASSEMBLING: _ClassVar[Stage.Name]
        EXPORT: _ClassVar[Stage.Name]
        STORE: _ClassVar[Stage.Name]
        DONE: _ClassVar[Stage.Name]
    NAME_UNSPECIFIED: Stage.Name
    DECODE: Stage.Name
    COMPILE: Stage.Name
    DECOMPOSING: Stage.Name
    LOWERING: Stage.Name
    KERNELS: Stage.Name
    ASSEMBLING: Stage.Name
    EXPORT: Stage.Name
    STORE: Stage.Name
    DONE: Stage.Name
    def __init__(self) -> None: ...

class SubmitReply(_message.Message):
    __slots__ = ("key", "state", "cache_hit", "deduplicated", "explanation")
    KEY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CACHE_HIT_FIELD_NUMBER: _ClassVar[int]
    DEDUPLICATED_FIELD_NUMBER: _ClassVar[int]
    EXPLANATION_FIELD_NUMBER: _ClassVar[int]
    key: str
    state: JobState
    cache_hit: bool
    deduplicated: bool
    explanation: MissExplanation
    def __init__(self, key: _Optional[str] = ..., state: _Optional[_Union[JobState, str]] = ..., cache_hit: _Optional[bool] = ..., deduplicated: _Optional[bool] = ..., explanation: _Optional[_Union[MissExplanation, _Mapping]] = ...) -> None: ...

class MissExplanation(_message.Message):
    __slots__ = ("reason", "closest_key", "detail", "differs")
    REASON_FIELD_NUMBER: _ClassVar[int]
    CLOSEST_KEY_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    DIFFERS_FIELD_NUMBER: _ClassVar[int]
    reason: str
    closest_key: str
    detail: str
    differs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, reason: _Optional[str] = ..., closest_key: _Optional[str] = ..., detail: _Optional[str] = ..., differs: _Optional[_Iterable[str]] = ...) -> None: ...

class JobRef(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...

class StageTiming(_message.Message):
    __slots__ = ("stage", "seconds", "queued_seconds", "kernels", "kernels_hit", "worker")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    KERNELS_FIELD_NUMBER: _ClassVar[int]
    KERNELS_HIT_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    stage: str
    seconds: float
    queued_seconds: float
    kernels: int
    kernels_hit: int
    worker: str
    def __init__(self, stage: _Optional[str] = ..., seconds: _Optional[float] = ..., queued_seconds: _Optional[float] = ..., kernels: _Optional[int] = ..., kernels_hit: _Optional[int] = ..., worker: _Optional[str] = ...) -> None: ...

class JobStatus(_message.Message):
    __slots__ = ("key", "state", "stage", "message", "error_code", "attempts", "queued_seconds", "timings", "artifact_bytes", "worker", "kernels_total", "kernels_done", "kernels_hit", "error", "stage_id", "unserved")
    KEY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_BYTES_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    KERNELS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    KERNELS_DONE_FIELD_NUMBER: _ClassVar[int]
    KERNELS_HIT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    STAGE_ID_FIELD_NUMBER: _ClassVar[int]
    UNSERVED_FIELD_NUMBER: _ClassVar[int]
    key: str
    state: JobState
    stage: str
    message: str
    error_code: str
    attempts: int
    queued_seconds: float
    timings: _containers.RepeatedCompositeFieldContainer[StageTiming]
    artifact_bytes: int
    worker: str
    kernels_total: int
    kernels_done: int
    kernels_hit: int
    error: JobError.Code
    stage_id: Stage.Name
    unserved: bool
    def __init__(self, key: _Optional[str] = ..., state: _Optional[_Union[JobState, str]] = ..., stage: _Optional[str] = ..., message: _Optional[str] = ..., error_code: _Optional[str] = ..., attempts: _Optional[int] = ..., queued_seconds: _Optional[float] = ..., timings: _Optional[_Iterable[_Union[StageTiming, _Mapping]]] = ..., artifact_bytes: _Optional[int] = ..., worker: _Optional[str] = ..., kernels_total: _Optional[int] = ..., kernels_done: _Optional[int] = ..., kernels_hit: _Optional[int] = ..., error: _Optional[_Union[JobError.Code, str]] = ..., stage_id: _Optional[_Union[Stage.Name, str]] = ..., unserved: _Optional[bool] = ...) -> None: ...

class ArtifactRef(_message.Message):
    __slots__ = ("key", "direct")
    KEY_FIELD_NUMBER: _ClassVar[int]
    DIRECT_FIELD_NUMBER: _ClassVar[int]
    key: str
    direct: bool
    def __init__(self, key: _Optional[str] = ..., direct: _Optional[bool] = ...) -> None: ...

class ArtifactChunk(_message.Message):
    __slots__ = ("manifest", "blob", "link")
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    BLOB_FIELD_NUMBER: _ClassVar[int]
    LINK_FIELD_NUMBER: _ClassVar[int]
    manifest: bytes
    blob: BlobChunk
    link: BlobLink
    def __init__(self, manifest: _Optional[bytes] = ..., blob: _Optional[_Union[BlobChunk, _Mapping]] = ..., link: _Optional[_Union[BlobLink, _Mapping]] = ...) -> None: ...

class BlobLink(_message.Message):
    __slots__ = ("digest", "size", "url", "expires_in_seconds")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    digest: str
    size: int
    url: str
    expires_in_seconds: float
    def __init__(self, digest: _Optional[str] = ..., size: _Optional[int] = ..., url: _Optional[str] = ..., expires_in_seconds: _Optional[float] = ...) -> None: ...

class BlobChunk(_message.Message):
    __slots__ = ("digest", "offset", "data")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    digest: str
    offset: int
    data: bytes
    def __init__(self, digest: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class FarmStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("name", "queue", "last_seen_seconds", "build", "targets", "fingerprint", "sandbox")
    class FingerprintEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BUILD_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_FIELD_NUMBER: _ClassVar[int]
    name: str
    queue: str
    last_seen_seconds: float
    build: str
    targets: _containers.RepeatedCompositeFieldContainer[ServedTarget]
    fingerprint: _containers.ScalarMap[str, str]
    sandbox: str
    def __init__(self, name: _Optional[str] = ..., queue: _Optional[str] = ..., last_seen_seconds: _Optional[float] = ..., build: _Optional[str] = ..., targets: _Optional[_Iterable[_Union[ServedTarget, _Mapping]]] = ..., fingerprint: _Optional[_Mapping[str, str]] = ..., sandbox: _Optional[str] = ...) -> None: ...

class ServedTarget(_message.Message):
    __slots__ = ("target", "jobs")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    target: str
    jobs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, target: _Optional[str] = ..., jobs: _Optional[_Iterable[str]] = ...) -> None: ...

class QueueInfo(_message.Message):
    __slots__ = ("name", "queued", "running")
    NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    name: str
    queued: int
    running: int
    def __init__(self, name: _Optional[str] = ..., queued: _Optional[int] = ..., running: _Optional[int] = ...) -> None: ...

class FarmStatus(_message.Message):
    __slots__ = ("workers", "queues", "artifacts", "cache_bytes", "coordinator_version", "recent_jobs", "in_flight", "job_info")
    class JobInfo(_message.Message):
        __slots__ = ("key", "label", "queue", "age_seconds", "idle_seconds")
        KEY_FIELD_NUMBER: _ClassVar[int]
        LABEL_FIELD_NUMBER: _ClassVar[int]
        QUEUE_FIELD_NUMBER: _ClassVar[int]
        AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
        IDLE_SECONDS_FIELD_NUMBER: _ClassVar[int]
        key: str
        label: str
        queue: str
        age_seconds: float
        idle_seconds: float
        def __init__(self, key: _Optional[str] = ..., label: _Optional[str] = ..., queue: _Optional[str] = ..., age_seconds: _Optional[float] = ..., idle_seconds: _Optional[float] = ...) -> None: ...
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
    CACHE_BYTES_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_VERSION_FIELD_NUMBER: _ClassVar[int]
    RECENT_JOBS_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    JOB_INFO_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerInfo]
    queues: _containers.RepeatedCompositeFieldContainer[QueueInfo]
    artifacts: int
    cache_bytes: int
    coordinator_version: str
    recent_jobs: _containers.RepeatedCompositeFieldContainer[JobStatus]
    in_flight: _containers.RepeatedCompositeFieldContainer[JobStatus]
    job_info: _containers.RepeatedCompositeFieldContainer[FarmStatus.JobInfo]
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerInfo, _Mapping]]] = ..., queues: _Optional[_Iterable[_Union[QueueInfo, _Mapping]]] = ..., artifacts: _Optional[int] = ..., cache_bytes: _Optional[int] = ..., coordinator_version: _Optional[str] = ..., recent_jobs: _Optional[_Iterable[_Union[JobStatus, _Mapping]]] = ..., in_flight: _Optional[_Iterable[_Union[JobStatus, _Mapping]]] = ..., job_info: _Optional[_Iterable[_Union[FarmStatus.JobInfo, _Mapping]]] = ...) -> None: ...

class CacheQuery(_message.Message):
    __slots__ = ("target", "older_than_seconds", "limit", "keys")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    OLDER_THAN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    target: str
    older_than_seconds: float
    limit: int
    keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, target: _Optional[str] = ..., older_than_seconds: _Optional[float] = ..., limit: _Optional[int] = ..., keys: _Optional[_Iterable[str]] = ...) -> None: ...

class CacheEntry(_message.Message):
    __slots__ = ("key", "label", "target", "bytes", "hits", "age_seconds", "last_hit_seconds", "kernels", "worker")
    KEY_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LAST_HIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    KERNELS_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    key: str
    label: str
    target: str
    bytes: int
    hits: int
    age_seconds: float
    last_hit_seconds: float
    kernels: int
    worker: str
    def __init__(self, key: _Optional[str] = ..., label: _Optional[str] = ..., target: _Optional[str] = ..., bytes: _Optional[int] = ..., hits: _Optional[int] = ..., age_seconds: _Optional[float] = ..., last_hit_seconds: _Optional[float] = ..., kernels: _Optional[int] = ..., worker: _Optional[str] = ...) -> None: ...

class CacheTargetTotals(_message.Message):
    __slots__ = ("target", "entries", "bytes", "hits")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    target: str
    entries: int
    bytes: int
    hits: int
    def __init__(self, target: _Optional[str] = ..., entries: _Optional[int] = ..., bytes: _Optional[int] = ..., hits: _Optional[int] = ...) -> None: ...

class CacheListing(_message.Message):
    __slots__ = ("entries", "matched", "bytes", "hits", "targets")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    MATCHED_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[CacheEntry]
    matched: int
    bytes: int
    hits: int
    targets: _containers.RepeatedCompositeFieldContainer[CacheTargetTotals]
    def __init__(self, entries: _Optional[_Iterable[_Union[CacheEntry, _Mapping]]] = ..., matched: _Optional[int] = ..., bytes: _Optional[int] = ..., hits: _Optional[int] = ..., targets: _Optional[_Iterable[_Union[CacheTargetTotals, _Mapping]]] = ...) -> None: ...

class CacheEvict(_message.Message):
    __slots__ = ("keys", "all", "target", "older_than_seconds")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    OLDER_THAN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    all: bool
    target: str
    older_than_seconds: float
    def __init__(self, keys: _Optional[_Iterable[str]] = ..., all: _Optional[bool] = ..., target: _Optional[str] = ..., older_than_seconds: _Optional[float] = ...) -> None: ...

class CacheEvictReply(_message.Message):
    __slots__ = ("evicted", "bytes")
    EVICTED_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    evicted: _containers.RepeatedScalarFieldContainer[str]
    bytes: int
    def __init__(self, evicted: _Optional[_Iterable[str]] = ..., bytes: _Optional[int] = ...) -> None: ...

class KernelRequest(_message.Message):
    __slots__ = ("source", "name", "signature", "constexprs", "target", "options", "triton_version", "label")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    CONSTEXPRS_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    TRITON_VERSION_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    source: str
    name: str
    signature: _containers.RepeatedCompositeFieldContainer[KernelArg]
    constexprs: _containers.RepeatedCompositeFieldContainer[Option]
    target: Target
    options: KernelOptions
    triton_version: str
    label: str
    def __init__(self, source: _Optional[str] = ..., name: _Optional[str] = ..., signature: _Optional[_Iterable[_Union[KernelArg, _Mapping]]] = ..., constexprs: _Optional[_Iterable[_Union[Option, _Mapping]]] = ..., target: _Optional[_Union[Target, _Mapping]] = ..., options: _Optional[_Union[KernelOptions, _Mapping]] = ..., triton_version: _Optional[str] = ..., label: _Optional[str] = ...) -> None: ...

class KernelArg(_message.Message):
    __slots__ = ("name", "type")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ...) -> None: ...

class KernelOptions(_message.Message):
    __slots__ = ("num_warps", "num_stages")
    NUM_WARPS_FIELD_NUMBER: _ClassVar[int]
    NUM_STAGES_FIELD_NUMBER: _ClassVar[int]
    num_warps: int
    num_stages: int
    def __init__(self, num_warps: _Optional[int] = ..., num_stages: _Optional[int] = ...) -> None: ...

class KernelReply(_message.Message):
    __slots__ = ("key", "cache_hit", "kind", "binary", "assembly", "metadata_json", "triton_version", "worker", "compile_seconds", "manifest")
    KEY_FIELD_NUMBER: _ClassVar[int]
    CACHE_HIT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    BINARY_FIELD_NUMBER: _ClassVar[int]
    ASSEMBLY_FIELD_NUMBER: _ClassVar[int]
    METADATA_JSON_FIELD_NUMBER: _ClassVar[int]
    TRITON_VERSION_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    COMPILE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    key: str
    cache_hit: bool
    kind: str
    binary: bytes
    assembly: str
    metadata_json: str
    triton_version: str
    worker: str
    compile_seconds: float
    manifest: bytes
    def __init__(self, key: _Optional[str] = ..., cache_hit: _Optional[bool] = ..., kind: _Optional[str] = ..., binary: _Optional[bytes] = ..., assembly: _Optional[str] = ..., metadata_json: _Optional[str] = ..., triton_version: _Optional[str] = ..., worker: _Optional[str] = ..., compile_seconds: _Optional[float] = ..., manifest: _Optional[bytes] = ...) -> None: ...

class PrecompiledUpload(_message.Message):
    __slots__ = ("manifest", "blobs", "record")
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    BLOBS_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    manifest: bytes
    blobs: _containers.RepeatedCompositeFieldContainer[PrecompiledBlob]
    record: PrecompiledRecord
    def __init__(self, manifest: _Optional[bytes] = ..., blobs: _Optional[_Iterable[_Union[PrecompiledBlob, _Mapping]]] = ..., record: _Optional[_Union[PrecompiledRecord, _Mapping]] = ...) -> None: ...

class PrecompiledRecord(_message.Message):
    __slots__ = ("model", "components", "parts")
    class ComponentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MODEL_FIELD_NUMBER: _ClassVar[int]
    COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    model: str
    components: _containers.ScalarMap[str, str]
    parts: _containers.RepeatedCompositeFieldContainer[PrecompiledPart]
    def __init__(self, model: _Optional[str] = ..., components: _Optional[_Mapping[str, str]] = ..., parts: _Optional[_Iterable[_Union[PrecompiledPart, _Mapping]]] = ...) -> None: ...

class PrecompiledPart(_message.Message):
    __slots__ = ("component", "name", "value")
    COMPONENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    component: str
    name: str
    value: str
    def __init__(self, component: _Optional[str] = ..., name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class PrecompiledMiss(_message.Message):
    __slots__ = ("key", "record")
    KEY_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    key: str
    record: PrecompiledRecord
    def __init__(self, key: _Optional[str] = ..., record: _Optional[_Union[PrecompiledRecord, _Mapping]] = ...) -> None: ...

class PrecompiledBlob(_message.Message):
    __slots__ = ("digest", "data")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    digest: str
    data: bytes
    def __init__(self, digest: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class PrecompiledReply(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...
