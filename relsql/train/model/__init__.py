"""What relsql.Model is made of: its spec and the factory that builds its learner, the views and
calls of its methods, search, the report, gradients as relations and the Loader."""
