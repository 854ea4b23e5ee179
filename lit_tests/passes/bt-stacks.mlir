// RUN: stageml-opt %s -p bt-stacks | filecheck %s
// RUN: stageml-opt %s -p bt-stacks,bt-verify | filecheck %s --check-prefix=VERIFY

// A routed expert layer after bt-lift: the router's arg-max picks each row's
// expert, and the expert stack (static, transposed to [E, in, out]) is lifted
// and indexed by those ids. The indexed stack becomes a bt.gather of its
// leading dimension; the stack that is also used whole (the dense product
// below) keeps its lift.

// CHECK-LABEL: func.func @main
// CHECK:         %[[T:[0-9]+]] = torch.aten.transpose.int %arg0
// CHECK:         %{{.*}}, %[[IDX:.*]] = torch.aten.max.dim
// CHECK-NOT:     "bt.lift"(%[[T]])
// CHECK:         %[[G:[0-9]+]] = "bt.gather"(%[[T]], %[[IDX]]) {bt.time = #bt.time<"dynamic">, from = #bt.time<"static">, name = "static.0", stack = "leading", to = #bt.time<"dynamic">} : (!torch.vtensor<[4,16,8],f32>, !torch.vtensor<[?],si64>) -> !torch.vtensor<[?,16,8],f32>
// CHECK-NOT:     torch.aten.index_select
// CHECK:         torch.aten.matmul %{{[0-9]+}}, %[[G]]
// CHECK:         "bt.lift"(%arg3) {{.*}}name = "dense.weight", to = #bt.time<"dynamic">
// CHECK:         return

// VERIFY-LABEL: func.func @main
// VERIFY:         "bt.gather"
module {
  func.func @main(%arg0: !torch.vtensor<[4,8,16],f32> {bt.name = "experts.weight", bt.time = #bt.time<"static">}, %arg1: !torch.vtensor<[4,16],f32> {bt.name = "router.weight", bt.time = #bt.time<"static">}, %arg2: !torch.vtensor<[?,16],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}, %arg3: !torch.vtensor<[16,8],f32> {bt.name = "dense.weight", bt.time = #bt.time<"static">}) -> (!torch.vtensor<[?,1,8],f32>, !torch.vtensor<[?,8],f32>) attributes {bt.program = "main"} {
    %int0 = torch.constant.int 0 {bt.time = #bt.time<"static">}
    %int1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
    %int2 = torch.constant.int 2 {bt.time = #bt.time<"static">}
    %int-1 = torch.constant.int -1 {bt.time = #bt.time<"static">}
    %false = torch.constant.bool false {bt.time = #bt.time<"static">}
    %0 = torch.aten.transpose.int %arg0, %int1, %int2 {bt.time = #bt.time<"static">} : !torch.vtensor<[4,8,16],f32>, !torch.int, !torch.int -> !torch.vtensor<[4,16,8],f32>
    %1 = torch.aten.transpose.int %arg1, %int0, %int1 {bt.time = #bt.time<"static">} : !torch.vtensor<[4,16],f32>, !torch.int, !torch.int -> !torch.vtensor<[16,4],f32>
    %2 = "bt.lift"(%1) {bt.time = #bt.time<"dynamic">, from = #bt.time<"static">, name = "static.1", to = #bt.time<"dynamic">} : (!torch.vtensor<[16,4],f32>) -> !torch.vtensor<[16,4],f32>
    %3 = torch.aten.matmul %arg2, %2 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,16],f32>, !torch.vtensor<[16,4],f32> -> !torch.vtensor<[?,4],f32>
    %values, %indices = torch.aten.max.dim %3, %int-1, %false {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,4],f32>, !torch.int, !torch.bool -> !torch.vtensor<[?],f32>, !torch.vtensor<[?],si64>
    %4 = "bt.lift"(%0) {bt.time = #bt.time<"dynamic">, from = #bt.time<"static">, name = "static.0", to = #bt.time<"dynamic">} : (!torch.vtensor<[4,16,8],f32>) -> !torch.vtensor<[4,16,8],f32>
    %5 = torch.aten.index_select %4, %int0, %indices {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[4,16,8],f32>, !torch.int, !torch.vtensor<[?],si64> -> !torch.vtensor<[?,16,8],f32>
    %6 = torch.aten.unsqueeze %arg2, %int1 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,16],f32>, !torch.int -> !torch.vtensor<[?,1,16],f32>
    %7 = torch.aten.matmul %6, %5 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,1,16],f32>, !torch.vtensor<[?,16,8],f32> -> !torch.vtensor<[?,1,8],f32>
    %8 = "bt.lift"(%arg3) {bt.time = #bt.time<"dynamic">, from = #bt.time<"static">, name = "dense.weight", to = #bt.time<"dynamic">} : (!torch.vtensor<[16,8],f32>) -> !torch.vtensor<[16,8],f32>
    %9 = torch.aten.matmul %arg2, %8 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,16],f32>, !torch.vtensor<[16,8],f32> -> !torch.vtensor<[?,8],f32>
    return %7, %9 : !torch.vtensor<[?,1,8],f32>, !torch.vtensor<[?,8],f32>
  }
}
