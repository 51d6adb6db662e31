"""Solutions to the self-check of lesson 00; the format: `course_lib.solutions`."""

# %% solution 00.broadcast
def predicted_broadcast_shape():
    # Line the shapes up from the right: (2, 1, 4) and (_, 3, 1). Column by column: 2 with a missing
    # axis -> 2; 1 with 3 -> 3; 4 with 1 -> 4.
    return (2, 3, 4)


# %% solution 00.gradient
def predicted_gradient():
    # y = x_1**2 + x_2**2 + x_3**2, so dy/dx_i = 2 * x_i; x.grad has the shape of x.
    return [2.0, 4.0, 6.0]


# %% solution 00.parameters
def predicted_parameter_count():
    # hidden: weight (8, 4) = 32 and bias (8,) = 8; out: weight (2, 8) = 16 and no bias.
    return 32 + 8 + 16
