from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OwnerKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OWNER_KIND_UNSPECIFIED: _ClassVar[OwnerKind]
    CONTAINER: _ClassVar[OwnerKind]
    CLAIM: _ClassVar[OwnerKind]
    DEVICES: _ClassVar[OwnerKind]
    SHARE_GROUP: _ClassVar[OwnerKind]
    MEMBER: _ClassVar[OwnerKind]
OWNER_KIND_UNSPECIFIED: OwnerKind
CONTAINER: OwnerKind
CLAIM: OwnerKind
DEVICES: OwnerKind
SHARE_GROUP: OwnerKind
MEMBER: OwnerKind

class InventoryRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Gpu(_message.Message):
    __slots__ = ("index", "uuid", "name", "pci_bus_id", "memory_total", "memory_reserved", "cores_reserved", "slices", "exclusive", "compute_capability", "health", "driver_limits")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_RESERVED_FIELD_NUMBER: _ClassVar[int]
    CORES_RESERVED_FIELD_NUMBER: _ClassVar[int]
    SLICES_FIELD_NUMBER: _ClassVar[int]
    EXCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    DRIVER_LIMITS_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    name: str
    pci_bus_id: str
    memory_total: int
    memory_reserved: int
    cores_reserved: int
    slices: int
    exclusive: bool
    compute_capability: str
    health: str
    driver_limits: str
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., name: _Optional[str] = ..., pci_bus_id: _Optional[str] = ..., memory_total: _Optional[int] = ..., memory_reserved: _Optional[int] = ..., cores_reserved: _Optional[int] = ..., slices: _Optional[int] = ..., exclusive: _Optional[bool] = ..., compute_capability: _Optional[str] = ..., health: _Optional[str] = ..., driver_limits: _Optional[str] = ...) -> None: ...

class Link(_message.Message):
    __slots__ = ("a", "b", "pcie", "nvlinks")
    A_FIELD_NUMBER: _ClassVar[int]
    B_FIELD_NUMBER: _ClassVar[int]
    PCIE_FIELD_NUMBER: _ClassVar[int]
    NVLINKS_FIELD_NUMBER: _ClassVar[int]
    a: int
    b: int
    pcie: str
    nvlinks: int
    def __init__(self, a: _Optional[int] = ..., b: _Optional[int] = ..., pcie: _Optional[str] = ..., nvlinks: _Optional[int] = ...) -> None: ...

class InventoryReply(_message.Message):
    __slots__ = ("gpus", "links", "driver_version")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    gpus: _containers.RepeatedCompositeFieldContainer[Gpu]
    links: _containers.RepeatedCompositeFieldContainer[Link]
    driver_version: str
    def __init__(self, gpus: _Optional[_Iterable[_Union[Gpu, _Mapping]]] = ..., links: _Optional[_Iterable[_Union[Link, _Mapping]]] = ..., driver_version: _Optional[str] = ...) -> None: ...

class Workload(_message.Message):
    __slots__ = ("namespace", "pod", "container")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    pod: str
    container: str
    def __init__(self, namespace: _Optional[str] = ..., pod: _Optional[str] = ..., container: _Optional[str] = ...) -> None: ...

class ReserveRequest(_message.Message):
    __slots__ = ("container_id", "annotations", "owner", "workload")
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    annotations: _containers.ScalarMap[str, str]
    owner: str
    workload: Workload
    def __init__(self, container_id: _Optional[str] = ..., annotations: _Optional[_Mapping[str, str]] = ..., owner: _Optional[str] = ..., workload: _Optional[_Union[Workload, _Mapping]] = ...) -> None: ...

class Share(_message.Message):
    __slots__ = ("gpu_index", "memory", "cores", "policy", "priority", "share_id")
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    CORES_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    SHARE_ID_FIELD_NUMBER: _ClassVar[int]
    gpu_index: int
    memory: int
    cores: int
    policy: str
    priority: str
    share_id: str
    def __init__(self, gpu_index: _Optional[int] = ..., memory: _Optional[int] = ..., cores: _Optional[int] = ..., policy: _Optional[str] = ..., priority: _Optional[str] = ..., share_id: _Optional[str] = ...) -> None: ...

class ReserveDevicesRequest(_message.Message):
    __slots__ = ("key", "resource", "gpu_uuid", "memory", "cores", "owner", "workload")
    KEY_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    CORES_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    key: str
    resource: str
    gpu_uuid: str
    memory: int
    cores: int
    owner: str
    workload: Workload
    def __init__(self, key: _Optional[str] = ..., resource: _Optional[str] = ..., gpu_uuid: _Optional[str] = ..., memory: _Optional[int] = ..., cores: _Optional[int] = ..., owner: _Optional[str] = ..., workload: _Optional[_Union[Workload, _Mapping]] = ...) -> None: ...

class ReserveClaimRequest(_message.Message):
    __slots__ = ("uid", "shares", "owner", "workload")
    UID_FIELD_NUMBER: _ClassVar[int]
    SHARES_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    uid: str
    shares: _containers.RepeatedCompositeFieldContainer[Share]
    owner: str
    workload: Workload
    def __init__(self, uid: _Optional[str] = ..., shares: _Optional[_Iterable[_Union[Share, _Mapping]]] = ..., owner: _Optional[str] = ..., workload: _Optional[_Union[Workload, _Mapping]] = ...) -> None: ...

class SliceGpu(_message.Message):
    __slots__ = ("index", "uuid", "memory_limit", "cores", "compute_target", "compute_used", "share_id", "policy", "priority", "owner_kind", "owner_uid", "driver_side", "compute_fitting")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_LIMIT_FIELD_NUMBER: _ClassVar[int]
    CORES_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_TARGET_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_USED_FIELD_NUMBER: _ClassVar[int]
    SHARE_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    OWNER_KIND_FIELD_NUMBER: _ClassVar[int]
    OWNER_UID_FIELD_NUMBER: _ClassVar[int]
    DRIVER_SIDE_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_FITTING_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    memory_limit: int
    cores: int
    compute_target: float
    compute_used: float
    share_id: str
    policy: str
    priority: str
    owner_kind: OwnerKind
    owner_uid: str
    driver_side: int
    compute_fitting: bool
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., memory_limit: _Optional[int] = ..., cores: _Optional[int] = ..., compute_target: _Optional[float] = ..., compute_used: _Optional[float] = ..., share_id: _Optional[str] = ..., policy: _Optional[str] = ..., priority: _Optional[str] = ..., owner_kind: _Optional[_Union[OwnerKind, str]] = ..., owner_uid: _Optional[str] = ..., driver_side: _Optional[int] = ..., compute_fitting: _Optional[bool] = ...) -> None: ...

class Slice(_message.Message):
    __slots__ = ("id", "container_id", "state", "gpus", "policy", "priority", "whole", "created_unix_ms", "pid", "pid_ns", "cgroup", "memory_used", "processes", "enforcement", "kind", "member_of", "share_keys", "workload", "owner_kind", "owner_uid")
    class ShareKeysEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    WHOLE_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    PID_NS_FIELD_NUMBER: _ClassVar[int]
    CGROUP_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    ENFORCEMENT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MEMBER_OF_FIELD_NUMBER: _ClassVar[int]
    SHARE_KEYS_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    OWNER_KIND_FIELD_NUMBER: _ClassVar[int]
    OWNER_UID_FIELD_NUMBER: _ClassVar[int]
    id: str
    container_id: str
    state: str
    gpus: _containers.RepeatedCompositeFieldContainer[SliceGpu]
    policy: str
    priority: str
    whole: bool
    created_unix_ms: int
    pid: int
    pid_ns: int
    cgroup: str
    memory_used: int
    processes: int
    enforcement: str
    kind: str
    member_of: str
    share_keys: _containers.ScalarMap[str, str]
    workload: Workload
    owner_kind: OwnerKind
    owner_uid: str
    def __init__(self, id: _Optional[str] = ..., container_id: _Optional[str] = ..., state: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[SliceGpu, _Mapping]]] = ..., policy: _Optional[str] = ..., priority: _Optional[str] = ..., whole: _Optional[bool] = ..., created_unix_ms: _Optional[int] = ..., pid: _Optional[int] = ..., pid_ns: _Optional[int] = ..., cgroup: _Optional[str] = ..., memory_used: _Optional[int] = ..., processes: _Optional[int] = ..., enforcement: _Optional[str] = ..., kind: _Optional[str] = ..., member_of: _Optional[str] = ..., share_keys: _Optional[_Mapping[str, str]] = ..., workload: _Optional[_Union[Workload, _Mapping]] = ..., owner_kind: _Optional[_Union[OwnerKind, str]] = ..., owner_uid: _Optional[str] = ...) -> None: ...

class BindRequest(_message.Message):
    __slots__ = ("container_id", "pid")
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    pid: int
    def __init__(self, container_id: _Optional[str] = ..., pid: _Optional[int] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("container_id",)
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    def __init__(self, container_id: _Optional[str] = ...) -> None: ...

class ReleaseReply(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: _Optional[bool] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("container_id",)
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    def __init__(self, container_id: _Optional[str] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListReply(_message.Message):
    __slots__ = ("slices",)
    SLICES_FIELD_NUMBER: _ClassVar[int]
    slices: _containers.RepeatedCompositeFieldContainer[Slice]
    def __init__(self, slices: _Optional[_Iterable[_Union[Slice, _Mapping]]] = ...) -> None: ...

class ResizeRequest(_message.Message):
    __slots__ = ("container_id", "annotations")
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    annotations: _containers.ScalarMap[str, str]
    def __init__(self, container_id: _Optional[str] = ..., annotations: _Optional[_Mapping[str, str]] = ...) -> None: ...
