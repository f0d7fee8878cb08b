//! RBAC authorization evaluated from stored Role/ClusterRole/RoleBinding/ClusterRoleBinding.
