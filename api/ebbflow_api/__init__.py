"""Ebbflow's shared API: the ElasticTrainingJob models, the CRD generated from them, and the
operator<->trainer contract. Importable without torch and without kopf or the Kubernetes client,
so the operator image and the trainer image both carry it and nothing of each other."""
