"""The kubelet device plugin (`gpuslice device-plugin`): slices that
kube-scheduler counts on Kubernetes before DRA's consumable capacity
(docs/device-plugin.md)."""
