// RUN: stageml-opt %s -p factorized-program | filecheck %s
// RUN: stageml-opt %s -p factorized-program | filecheck %s --check-prefix=CLONE
// RUN: stageml-opt %s -p factorized-program | filecheck %s --check-prefix=ONE
// RUN: stageml-opt %s -p factorized-program | filecheck %s --check-prefix=OTHER

// A multi-tenant compile's second program: the "main" program function
// (here lora-sites' output) is cloned into @main_factorized with
// bt.program = "factorized": same arguments, same ops with the same binding
// times. @main and the module's facts stay as they are; a function that is
// not a program is not cloned. (Where the clone lands among the module's
// functions is not checked.)

// CHECK:       module attributes {bt.sites = [{{.*}}lora_A = "fc.lora_A.default.weight"{{.*}}], bt.tenants = {max_adapters = 4 : i64, max_rank = 8 : i64}}
// CHECK-LABEL: func.func @main(
// CHECK-SAME:    %arg1: !torch.vtensor<[8,64],f32> {bt.name = "fc.lora_A.default.weight", bt.time = #bt.time<"adapter">}
// CHECK-SAME:    attributes {bt.program = "main"}
// CHECK:         %[[Z:[0-9]+]] = torch.aten.add.Tensor
// CHECK-NEXT:    return %[[Z]]
// CHECK-NEXT:  }

// CLONE-LABEL: func.func @main_factorized(
// CLONE-SAME:    %arg0: !torch.vtensor<[48,64],f32> {bt.name = "fc.base_layer.weight", bt.time = #bt.time<"static">}
// CLONE-SAME:    %arg1: !torch.vtensor<[8,64],f32> {bt.name = "fc.lora_A.default.weight", bt.time = #bt.time<"adapter">}
// CLONE-SAME:    %arg2: !torch.vtensor<[48,8],f32> {bt.name = "fc.lora_B.default.weight", bt.time = #bt.time<"adapter">}
// CLONE-SAME:    %arg3: !torch.vtensor<[?,64],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}
// CLONE-SAME:    -> !torch.vtensor<[?,48],f32> attributes {bt.program = "factorized"}
// CLONE:         %[[WT:[0-9]+]] = torch.aten.transpose.int %arg0, {{.*}} {bt.time = #bt.time<"static">}
// CLONE:         %[[AT:[0-9]+]] = torch.aten.transpose.int %arg1, {{.*}} {bt.time = #bt.time<"adapter">}
// CLONE-NEXT:    %[[BT:[0-9]+]] = torch.aten.transpose.int %arg2, {{.*}} {bt.time = #bt.time<"adapter">}
// CLONE-NEXT:    %[[Y:[0-9]+]] = torch.aten.matmul %arg3, %[[WT]] {bt.time = #bt.time<"dynamic">}
// CLONE-NEXT:    %[[T:[0-9]+]] = torch.aten.matmul %arg3, %[[AT]] {bt.time = #bt.time<"dynamic">}
// CLONE-NEXT:    %[[U:[0-9]+]] = torch.aten.matmul %[[T]], %[[BT]] {bt.time = #bt.time<"dynamic">}
// CLONE-NEXT:    %[[Z:[0-9]+]] = torch.aten.add.Tensor %[[Y]], %[[U]], %{{.*}} {bt.time = #bt.time<"dynamic">}
// CLONE-NEXT:    return %[[Z]]
// CLONE-NEXT:  }

// One clone, and only of the program function.
// ONE:       attributes {bt.program = "factorized"}
// ONE-NOT:   bt.program = "factorized"
// OTHER-NOT: @helper_factorized
module attributes {bt.sites = [{dtype = "float32", experts = 0 : i64, in_features = 64 : i64, lora_A = "fc.lora_A.default.weight", lora_B = "fc.lora_B.default.weight", out_features = 48 : i64, rank = 4 : i64, scaling = 2.000000e+00 : f64}], bt.tenants = {max_adapters = 4 : i64, max_rank = 8 : i64}} {
  func.func @main(%arg0: !torch.vtensor<[48,64],f32> {bt.name = "fc.base_layer.weight", bt.time = #bt.time<"static">}, %arg1: !torch.vtensor<[8,64],f32> {bt.name = "fc.lora_A.default.weight", bt.time = #bt.time<"adapter">}, %arg2: !torch.vtensor<[48,8],f32> {bt.name = "fc.lora_B.default.weight", bt.time = #bt.time<"adapter">}, %arg3: !torch.vtensor<[?,64],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}) -> !torch.vtensor<[?,48],f32> attributes {bt.program = "main"} {
    %int0 = torch.constant.int 0 {bt.time = #bt.time<"static">}
    %int1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
    %0 = torch.aten.transpose.int %arg0, %int0, %int1 {bt.time = #bt.time<"static">} : !torch.vtensor<[48,64],f32>, !torch.int, !torch.int -> !torch.vtensor<[64,48],f32>
    %int0_0 = torch.constant.int 0 {bt.time = #bt.time<"static">}
    %int1_1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
    %1 = torch.aten.transpose.int %arg1, %int0_0, %int1_1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[8,64],f32>, !torch.int, !torch.int -> !torch.vtensor<[64,8],f32>
    %2 = torch.aten.transpose.int %arg2, %int0_0, %int1_1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[48,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[8,48],f32>
    %3 = torch.aten.matmul %arg3, %0 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,64],f32>, !torch.vtensor<[64,48],f32> -> !torch.vtensor<[?,48],f32>
    %4 = torch.aten.matmul %arg3, %1 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,64],f32>, !torch.vtensor<[64,8],f32> -> !torch.vtensor<[?,8],f32>
    %5 = torch.aten.matmul %4, %2 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,48],f32> -> !torch.vtensor<[?,48],f32>
    %6 = torch.aten.add.Tensor %3, %5, %int1_1 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,48],f32>, !torch.vtensor<[?,48],f32>, !torch.int -> !torch.vtensor<[?,48],f32>
    return %6 : !torch.vtensor<[?,48],f32>
  }

  func.func @helper(%arg0: !torch.vtensor<[?,48],f32>) -> !torch.vtensor<[?,48],f32> {
    return %arg0 : !torch.vtensor<[?,48],f32>
  }
}
