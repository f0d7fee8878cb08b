//! kleym API types: our CRDs (group `kleym.io`, version `v1alpha1`) and the external
//! types kleym reads (ClusterProfile, InferencePool, InferenceObjective, InferenceModel)
//! or writes (ClusterSPIFFEID).
