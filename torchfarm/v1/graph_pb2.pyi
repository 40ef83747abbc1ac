from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GraphFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GRAPH_FORMAT_UNSPECIFIED: _ClassVar[GraphFormat]
    GRAPH_FORMAT_V1: _ClassVar[GraphFormat]
    GRAPH_FORMAT_V2: _ClassVar[GraphFormat]
GRAPH_FORMAT_UNSPECIFIED: GraphFormat
GRAPH_FORMAT_V1: GraphFormat
GRAPH_FORMAT_V2: GraphFormat

class Graph(_message.Message):
    __slots__ = ("format", "nodes", "constants", "symbols", "groups", "subgraphs", "meshes", "rank", "custom_ops")
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    CONSTANTS_FIELD_NUMBER: _ClassVar[int]
    SYMBOLS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    SUBGRAPHS_FIELD_NUMBER: _ClassVar[int]
    MESHES_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_OPS_FIELD_NUMBER: _ClassVar[int]
    format: GraphFormat
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    constants: _containers.RepeatedCompositeFieldContainer[Constant]
    symbols: _containers.RepeatedCompositeFieldContainer[Symbol]
    groups: _containers.RepeatedCompositeFieldContainer[ProcessGroup]
    subgraphs: _containers.RepeatedCompositeFieldContainer[Subgraph]
    meshes: _containers.RepeatedCompositeFieldContainer[DeviceMesh]
    rank: int
    custom_ops: _containers.RepeatedCompositeFieldContainer[CustomOp]
    def __init__(self, format: _Optional[_Union[GraphFormat, str]] = ..., nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ..., constants: _Optional[_Iterable[_Union[Constant, _Mapping]]] = ..., symbols: _Optional[_Iterable[_Union[Symbol, _Mapping]]] = ..., groups: _Optional[_Iterable[_Union[ProcessGroup, _Mapping]]] = ..., subgraphs: _Optional[_Iterable[_Union[Subgraph, _Mapping]]] = ..., meshes: _Optional[_Iterable[_Union[DeviceMesh, _Mapping]]] = ..., rank: _Optional[int] = ..., custom_ops: _Optional[_Iterable[_Union[CustomOp, _Mapping]]] = ...) -> None: ...

class Subgraph(_message.Message):
    __slots__ = ("name", "graph")
    NAME_FIELD_NUMBER: _ClassVar[int]
    GRAPH_FIELD_NUMBER: _ClassVar[int]
    name: str
    graph: Graph
    def __init__(self, name: _Optional[str] = ..., graph: _Optional[_Union[Graph, _Mapping]] = ...) -> None: ...

class ProcessGroup(_message.Message):
    __slots__ = ("name", "size", "ranks")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    name: str
    size: int
    ranks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., size: _Optional[int] = ..., ranks: _Optional[_Iterable[int]] = ...) -> None: ...

class DeviceMesh(_message.Message):
    __slots__ = ("device_type", "shape", "ranks", "dim_names", "group_names")
    DEVICE_TYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    DIM_NAMES_FIELD_NUMBER: _ClassVar[int]
    GROUP_NAMES_FIELD_NUMBER: _ClassVar[int]
    device_type: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    ranks: _containers.RepeatedScalarFieldContainer[int]
    dim_names: _containers.RepeatedScalarFieldContainer[str]
    group_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, device_type: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., ranks: _Optional[_Iterable[int]] = ..., dim_names: _Optional[_Iterable[str]] = ..., group_names: _Optional[_Iterable[str]] = ...) -> None: ...

class Placement(_message.Message):
    __slots__ = ("shard", "replicate", "partial")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    REPLICATE_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_FIELD_NUMBER: _ClassVar[int]
    shard: int
    replicate: NoneValue
    partial: str
    def __init__(self, shard: _Optional[int] = ..., replicate: _Optional[_Union[NoneValue, _Mapping]] = ..., partial: _Optional[str] = ...) -> None: ...

class DTensorMeta(_message.Message):
    __slots__ = ("mesh", "placements", "shape", "stride")
    MESH_FIELD_NUMBER: _ClassVar[int]
    PLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    STRIDE_FIELD_NUMBER: _ClassVar[int]
    mesh: int
    placements: _containers.RepeatedCompositeFieldContainer[Placement]
    shape: _containers.RepeatedCompositeFieldContainer[SymExpr]
    stride: _containers.RepeatedCompositeFieldContainer[SymExpr]
    def __init__(self, mesh: _Optional[int] = ..., placements: _Optional[_Iterable[_Union[Placement, _Mapping]]] = ..., shape: _Optional[_Iterable[_Union[SymExpr, _Mapping]]] = ..., stride: _Optional[_Iterable[_Union[SymExpr, _Mapping]]] = ...) -> None: ...

class MeshInput(_message.Message):
    __slots__ = ("mesh",)
    MESH_FIELD_NUMBER: _ClassVar[int]
    mesh: int
    def __init__(self, mesh: _Optional[int] = ...) -> None: ...

class CustomOp(_message.Message):
    __slots__ = ("target", "schema")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    target: str
    schema: str
    def __init__(self, target: _Optional[str] = ..., schema: _Optional[str] = ...) -> None: ...

class CustomCall(_message.Message):
    __slots__ = ("inputs", "outputs")
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedCompositeFieldContainer[TensorMeta]
    outputs: _containers.RepeatedCompositeFieldContainer[TensorMeta]
    def __init__(self, inputs: _Optional[_Iterable[_Union[TensorMeta, _Mapping]]] = ..., outputs: _Optional[_Iterable[_Union[TensorMeta, _Mapping]]] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("name", "op", "target", "args", "kwargs", "tensor", "symint", "dtensor", "mesh", "custom")
    class Op(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        OP_UNSPECIFIED: _ClassVar[Node.Op]
        PLACEHOLDER: _ClassVar[Node.Op]
        CALL_FUNCTION: _ClassVar[Node.Op]
        CALL_METHOD: _ClassVar[Node.Op]
        GET_ATTR: _ClassVar[Node.Op]
        OUTPUT: _ClassVar[Node.Op]
    OP_UNSPECIFIED: Node.Op
    PLACEHOLDER: Node.Op
    CALL_FUNCTION: Node.Op
    CALL_METHOD: Node.Op
    GET_ATTR: Node.Op
    OUTPUT: Node.Op
    NAME_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    KWARGS_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    SYMINT_FIELD_NUMBER: _ClassVar[int]
    DTENSOR_FIELD_NUMBER: _ClassVar[int]
    MESH_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_FIELD_NUMBER: _ClassVar[int]
    name: str
    op: Node.Op
    target: str
    args: _containers.RepeatedCompositeFieldContainer[Argument]
    kwargs: _containers.RepeatedCompositeFieldContainer[Keyword]
    tensor: TensorMeta
    symint: SymExpr
    dtensor: DTensorMeta
    mesh: MeshInput
    custom: CustomCall
    def __init__(self, name: _Optional[str] = ..., op: _Optional[_Union[Node.Op, str]] = ..., target: _Optional[str] = ..., args: _Optional[_Iterable[_Union[Argument, _Mapping]]] = ..., kwargs: _Optional[_Iterable[_Union[Keyword, _Mapping]]] = ..., tensor: _Optional[_Union[TensorMeta, _Mapping]] = ..., symint: _Optional[_Union[SymExpr, _Mapping]] = ..., dtensor: _Optional[_Union[DTensorMeta, _Mapping]] = ..., mesh: _Optional[_Union[MeshInput, _Mapping]] = ..., custom: _Optional[_Union[CustomCall, _Mapping]] = ...) -> None: ...

class Keyword(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: Argument
    def __init__(self, name: _Optional[str] = ..., value: _Optional[_Union[Argument, _Mapping]] = ...) -> None: ...

class Argument(_message.Message):
    __slots__ = ("node", "none", "bool_value", "int_value", "float_value", "str_value", "list", "tuple", "slice", "dtype", "device", "layout", "memory_format", "sym", "immutable_dict", "placement", "complex_value")
    NODE_FIELD_NUMBER: _ClassVar[int]
    NONE_FIELD_NUMBER: _ClassVar[int]
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    FLOAT_VALUE_FIELD_NUMBER: _ClassVar[int]
    STR_VALUE_FIELD_NUMBER: _ClassVar[int]
    LIST_FIELD_NUMBER: _ClassVar[int]
    TUPLE_FIELD_NUMBER: _ClassVar[int]
    SLICE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FORMAT_FIELD_NUMBER: _ClassVar[int]
    SYM_FIELD_NUMBER: _ClassVar[int]
    IMMUTABLE_DICT_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    COMPLEX_VALUE_FIELD_NUMBER: _ClassVar[int]
    node: str
    none: NoneValue
    bool_value: bool
    int_value: int
    float_value: float
    str_value: str
    list: ArgumentList
    tuple: ArgumentList
    slice: Slice
    dtype: str
    device: Device
    layout: str
    memory_format: str
    sym: SymExpr
    immutable_dict: ArgumentList
    placement: Placement
    complex_value: Complex
    def __init__(self, node: _Optional[str] = ..., none: _Optional[_Union[NoneValue, _Mapping]] = ..., bool_value: _Optional[bool] = ..., int_value: _Optional[int] = ..., float_value: _Optional[float] = ..., str_value: _Optional[str] = ..., list: _Optional[_Union[ArgumentList, _Mapping]] = ..., tuple: _Optional[_Union[ArgumentList, _Mapping]] = ..., slice: _Optional[_Union[Slice, _Mapping]] = ..., dtype: _Optional[str] = ..., device: _Optional[_Union[Device, _Mapping]] = ..., layout: _Optional[str] = ..., memory_format: _Optional[str] = ..., sym: _Optional[_Union[SymExpr, _Mapping]] = ..., immutable_dict: _Optional[_Union[ArgumentList, _Mapping]] = ..., placement: _Optional[_Union[Placement, _Mapping]] = ..., complex_value: _Optional[_Union[Complex, _Mapping]] = ...) -> None: ...

class Complex(_message.Message):
    __slots__ = ("real", "imag")
    REAL_FIELD_NUMBER: _ClassVar[int]
    IMAG_FIELD_NUMBER: _ClassVar[int]
    real: float
    imag: float
    def __init__(self, real: _Optional[float] = ..., imag: _Optional[float] = ...) -> None: ...

class NoneValue(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ArgumentList(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[Argument]
    def __init__(self, items: _Optional[_Iterable[_Union[Argument, _Mapping]]] = ...) -> None: ...

class Slice(_message.Message):
    __slots__ = ("start", "stop", "step")
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    start: Argument
    stop: Argument
    step: Argument
    def __init__(self, start: _Optional[_Union[Argument, _Mapping]] = ..., stop: _Optional[_Union[Argument, _Mapping]] = ..., step: _Optional[_Union[Argument, _Mapping]] = ...) -> None: ...

class Device(_message.Message):
    __slots__ = ("type", "index")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    type: str
    index: int
    def __init__(self, type: _Optional[str] = ..., index: _Optional[int] = ...) -> None: ...

class SymExpr(_message.Message):
    __slots__ = ("expr", "hint")
    EXPR_FIELD_NUMBER: _ClassVar[int]
    HINT_FIELD_NUMBER: _ClassVar[int]
    expr: str
    hint: int
    def __init__(self, expr: _Optional[str] = ..., hint: _Optional[int] = ...) -> None: ...

class Symbol(_message.Message):
    __slots__ = ("name", "hint", "min", "max")
    NAME_FIELD_NUMBER: _ClassVar[int]
    HINT_FIELD_NUMBER: _ClassVar[int]
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    name: str
    hint: int
    min: int
    max: int
    def __init__(self, name: _Optional[str] = ..., hint: _Optional[int] = ..., min: _Optional[int] = ..., max: _Optional[int] = ...) -> None: ...

class TensorMeta(_message.Message):
    __slots__ = ("shape", "stride", "dtype", "device", "requires_grad", "kind", "storage_offset")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[TensorMeta.Kind]
        INPUT: _ClassVar[TensorMeta.Kind]
        PARAMETER: _ClassVar[TensorMeta.Kind]
        BUFFER: _ClassVar[TensorMeta.Kind]
    KIND_UNSPECIFIED: TensorMeta.Kind
    INPUT: TensorMeta.Kind
    PARAMETER: TensorMeta.Kind
    BUFFER: TensorMeta.Kind
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    STRIDE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    REQUIRES_GRAD_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STORAGE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    shape: _containers.RepeatedCompositeFieldContainer[SymExpr]
    stride: _containers.RepeatedCompositeFieldContainer[SymExpr]
    dtype: str
    device: Device
    requires_grad: bool
    kind: TensorMeta.Kind
    storage_offset: int
    def __init__(self, shape: _Optional[_Iterable[_Union[SymExpr, _Mapping]]] = ..., stride: _Optional[_Iterable[_Union[SymExpr, _Mapping]]] = ..., dtype: _Optional[str] = ..., device: _Optional[_Union[Device, _Mapping]] = ..., requires_grad: _Optional[bool] = ..., kind: _Optional[_Union[TensorMeta.Kind, str]] = ..., storage_offset: _Optional[int] = ...) -> None: ...

class Constant(_message.Message):
    __slots__ = ("name", "shape", "dtype", "data", "requires_grad")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    REQUIRES_GRAD_FIELD_NUMBER: _ClassVar[int]
    name: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    data: bytes
    requires_grad: bool
    def __init__(self, name: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ..., data: _Optional[bytes] = ..., requires_grad: _Optional[bool] = ...) -> None: ...
