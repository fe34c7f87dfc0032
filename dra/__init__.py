"""The DRA driver `gpuslice.io`: a kubelet plugin that publishes each GPU as a
shareable device with `memory` and `cores` capacity (kube-scheduler places
claims on it) and turns each allocated claim into a slice of the daemon, with
a CDI device the kubelet hands to the container runtime."""
