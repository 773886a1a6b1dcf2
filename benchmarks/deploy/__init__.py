"""Installing and running where users deploy: the slim server install against the full one,
and `jaxtpu archive` on Beam against `jaxtpu predict`."""
