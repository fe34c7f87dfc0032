"""A kubelet-like CRI client: the official runtime.v1 proto (reference "cri"),
compiled at test time with grpcio-tools, driving a container runtime's CRI
socket the way the kubelet does: RunPodSandbox with a runtime handler, then
CreateContainer, StartContainer, StopContainer, StopPodSandbox, RemovePodSandbox."""

from __future__ import annotations

import importlib
import subprocess
import sys
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from tests.harness.references import reference

NODE = 2  # runtime.v1.NamespaceMode.NODE: the host's network, so no CNI is needed


def compile_api(out: Path) -> tuple[ModuleType, ModuleType]:
    """runtime.v1's api_pb2 and api_pb2_grpc, generated into `out`."""
    proto_dir = reference("cri")
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{proto_dir}", f"--python_out={out}",
         f"--grpc_python_out={out}", str(proto_dir / "api.proto")],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    if str(out) not in sys.path:
        sys.path.insert(0, str(out))
    return importlib.import_module("api_pb2"), importlib.import_module("api_pb2_grpc")


class Kubelet:
    """What the kubelet asks of a CRI runtime, for one node's pods."""

    def __init__(self, socket: Path, api: tuple[ModuleType, ModuleType], timeout: float = 60) -> None:
        self.pb, grpc_mod = api
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.runtime = grpc_mod.RuntimeServiceStub(self.channel)
        self.images = grpc_mod.ImageServiceStub(self.channel)
        self.timeout = timeout

    def close(self) -> None:
        self.channel.close()

    def version(self) -> Any:
        return self.runtime.Version(self.pb.VersionRequest(version="v1"), timeout=self.timeout)

    def pod_config(self, name: str, annotations: dict[str, str], log_directory: str = "") -> Any:
        pb = self.pb
        return pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, namespace="default", uid=str(uuid.uuid4()), attempt=0),
            annotations=annotations,
            log_directory=log_directory,
            linux=pb.LinuxPodSandboxConfig(
                security_context=pb.LinuxSandboxSecurityContext(
                    namespace_options=pb.NamespaceOption(network=NODE, pid=1, ipc=NODE)
                )
            ),
        )

    def run_pod(
        self, name: str, annotations: dict[str, str], handler: str = "gpuslice", log_directory: str = ""
    ) -> tuple[str, Any]:
        config = self.pod_config(name, annotations, log_directory)
        reply = self.runtime.RunPodSandbox(
            self.pb.RunPodSandboxRequest(config=config, runtime_handler=handler), timeout=self.timeout
        )
        return reply.pod_sandbox_id, config

    def create(
        self,
        pod_id: str,
        pod_config: Any,
        name: str,
        image: str,
        command: list[str],
        annotations: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
        cdi_devices: list[str] = (),  # type: ignore[assignment]
        log_path: str = "",
        mounts: dict[str, str] | None = None,  # container path -> host path, read-only
        readonly_rootfs: bool = False,  # what the kubelet sends for readOnlyRootFilesystem
    ) -> str:
        pb = self.pb
        config = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name, attempt=0),
            image=pb.ImageSpec(image=image),
            command=command,
            annotations=annotations or {},
            envs=[pb.KeyValue(key=k, value=v.encode()) for k, v in (env or {}).items()],  # value: bytes in the proto
            CDI_devices=[pb.CDIDevice(name=d) for d in cdi_devices],
            log_path=log_path,
            mounts=[pb.Mount(container_path=c, host_path=h, readonly=True) for c, h in (mounts or {}).items()],
            linux=pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(readonly_rootfs=True))
            if readonly_rootfs
            else None,
        )
        reply = self.runtime.CreateContainer(
            pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=config, sandbox_config=pod_config),
            timeout=self.timeout,
        )
        return reply.container_id

    def start(self, cid: str) -> None:
        self.runtime.StartContainer(self.pb.StartContainerRequest(container_id=cid), timeout=self.timeout)

    def stop(self, cid: str, grace: int = 0) -> None:
        self.runtime.StopContainer(self.pb.StopContainerRequest(container_id=cid, timeout=grace), timeout=self.timeout)

    def status(self, cid: str) -> Any:
        return self.runtime.ContainerStatus(
            self.pb.ContainerStatusRequest(container_id=cid), timeout=self.timeout
        ).status

    def stop_pod(self, pod_id: str) -> None:
        self.runtime.StopPodSandbox(self.pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=self.timeout)

    def remove_pod(self, pod_id: str) -> None:
        self.runtime.RemovePodSandbox(self.pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=self.timeout)

    def has_image(self, ref: str) -> bool:
        """Whether the runtime's image service knows `ref` (ImageStatus answers an
        empty image for one it does not)."""
        reply = self.images.ImageStatus(self.pb.ImageStatusRequest(image=self.pb.ImageSpec(image=ref)),
                                        timeout=self.timeout)  # fmt: skip
        return bool(reply.image.id)

    def pods(self) -> list[Any]:
        return list(self.runtime.ListPodSandbox(self.pb.ListPodSandboxRequest(), timeout=self.timeout).items)
