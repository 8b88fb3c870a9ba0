"""HyperPod: the KubeRay RayJob that trains, and its launcher."""
