"""GSD's token graph: a draft tree whose tau-redundant nodes are merged into a DAG while drafting and
unmerged into a tree for verification, by the rules of docs/methods.md §GSD."""


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
        up = self.path(node)[:n]
        return tuple(self.token[x] for x in reversed(up)) if len(up) == n else None

    def _register(self, node):
        key = None if self.tau is None else self._key(node, self.tau + 1)
        if key is not None:
            self._index.setdefault(key, []).append(node)

    def find_redundant(self, u, t):
        """The first node that a new child ``t`` of ``u`` would repeat, or None."""
        key = None if self.tau is None else self._key(u, self.tau)
        matches = None if key is None else self._index.get((*key, t))
        if not matches:
            return None
        on_path = set(self.path(u))
        return next((v for v in matches if v not in on_path and not self._reaches(v, u)), None)

    def _reaches(self, v, u):
        stack, seen = [v], set()
        while stack:
            x = stack.pop()
            if x == u:
                return True
            if x not in seen:
                seen.add(x)
                stack += self.children[x] + self.pseudo[x]
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
        parents, src, copied, depth = [-1], [0], [False], [0]
        head = 0
        while head < len(src) and len(src) < max_nodes:
            g = src[head]
            if depth[head] < max_depth:
                kids = [(c, False) for c in self.children[g]] + [(v, True) for v in self.pseudo[g]]
                for c, via_merge in kids[: max_nodes - len(src)]:
                    parents.append(head)
                    src.append(c)
                    copied.append(copied[head] or via_merge)
                    depth.append(depth[head] + 1)
            head += 1
        return [self.token[g] for g in src], parents, src, copied
