"""GSD's token graph (docs/methods.md §GSD): a draft tree whose tau-redundant nodes are merged into
a DAG while drafting, and unmerged back into a tree for verification.

* ``tau`` follows the reference code's convention (the paper's KL table has tau = 0): a new child
  ``t`` of ``u`` is redundant when an existing node (not on u's root path) has token ``t`` and its
  ``tau`` nearest predecessors carry the same tokens as ``u`` and its ``tau - 1`` nearest
  predecessors, i.e. a (tau+1)-gram repeats. ``tau=None`` disables merging (the graph is then TSD's
  tree). Predecessors may include the root.
* The redundant token is never materialised (the reference code's form): ``u`` gets a pseudo-edge to
  the first occurrence ``v`` (the earliest created match), whose successors are then shared. A merge
  whose target can reach the source is rejected (no cycles). ``u`` keeps a list of pseudo-children.
* ``unmerge`` copies every pseudo-child's subtree in BFS order (``parents[i] < i``), capped by node
  count and depth; ``src`` maps tree nodes to graph nodes, ``copied`` flags nodes reached through a
  merge edge (whose draft K/V belong to another context).
"""


class TokenGraph:
    def __init__(self, root_token, tau=None):
        self.tau = tau
        self.token, self.parent, self.children, self.pseudo = [root_token], [-1], [[]], [[]]
        self._index = {}  # (tau+1)-gram key -> node ids in creation order
        self._register(0)

    def __len__(self):
        return len(self.token)

    def _key(self, node, n):
        # Tokens of the node and its n - 1 predecessors, oldest first; None if the path is too short.
        out = []
        for _ in range(n):
            if node < 0:
                return None
            out.append(self.token[node])
            node = self.parent[node]
        return tuple(reversed(out))

    def _register(self, node):
        if self.tau is not None:
            key = self._key(node, self.tau + 1)
            if key is not None:
                self._index.setdefault(key, []).append(node)

    def find_redundant(self, u, t):
        """The first node that a new child ``t`` of ``u`` would repeat, or None."""
        key = None if self.tau is None else self._key(u, self.tau)
        matches = None if key is None else self._index.get((*key, t))
        if not matches:
            return None
        on_path = set(self.path(u))
        for v in matches:
            if v not in on_path and not self._reaches(v, u):
                return v
        return None

    def _reaches(self, v, u):
        stack, seen = [v], set()
        while stack:
            x = stack.pop()
            if x == u:
                return True
            if x in seen:
                continue
            seen.add(x)
            stack.extend(self.children[x])
            stack.extend(self.pseudo[x])
        return False

    def path(self, node):
        out = []
        while node >= 0:
            out.append(node)
            node = self.parent[node]
        return out

    def add(self, u, t):
        """A real child of ``u``; returns its id."""
        self.token.append(t)
        self.parent.append(u)
        self.children.append([])
        self.pseudo.append([])
        node = len(self.token) - 1
        self.children[u].append(node)
        self._register(node)
        return node

    def merge(self, u, v):
        self.pseudo[u].append(v)

    def unmerge(self, max_nodes, max_depth):
        """The tree of all root paths of the graph. Returns (tokens, parents, src, copied)."""
        tokens, parents, src, copied, depth = [self.token[0]], [-1], [0], [False], [0]
        head = 0
        while head < len(src) and len(src) < max_nodes:
            g = src[head]
            if depth[head] < max_depth:
                kids = [(c, False) for c in self.children[g]] + [(v, True) for v in self.pseudo[g]]
                for c, via_merge in kids:
                    if len(src) >= max_nodes:
                        break
                    tokens.append(self.token[c])
                    parents.append(head)
                    src.append(c)
                    copied.append(copied[head] or via_merge)
                    depth.append(depth[head] + 1)
            head += 1
        return tokens, parents, src, copied
