"""The HyperPod run rehearsed on one machine: a local Kubernetes API with a KubeRay that runs RayJob
entrypoints on a local Ray (kube_api, kuberay), S3 and SageMaker on moto (aws), a tiny model with the
real one's proportions (model), and the driver that runs the compiled cluster DAG with kfp.local (run)."""
