"""What every HTTP route of every service needs, below the services: typed API errors, API keys
and their scopes, the authenticated tenant, and the JSON body reader (DESIGN §1, STYLE §11).

The HTTP process (``services/cli/http_edge.py``) builds one ``ApiContext`` and hands it to each
service's routes, which it then mounts on the edge (``services/edge``).
"""
